"""Helpers for the launch tests: run `torchpace launch` in a subprocess, read the workers' reports."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"


def run_launch(args: list[str], env: dict[str, str], timeout_s: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`torchpace launch ARGS` in a subprocess, with output captured as text."""
    return subprocess.run([sys.executable, "-m", "torchpace", "launch", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout_s)


def start_launch(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`torchpace launch ARGS` started in the background (stdout/stderr captured)."""
    return subprocess.Popen([sys.executable, "-m", "torchpace", "launch", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_reports(out_dir: Path) -> dict[int, dict]:
    """rank -> the report each worker wrote (workers/rank_report.py)."""
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out_dir.glob("rank-*.json")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_gone(pid: int) -> bool:
    """True when `pid` has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"
