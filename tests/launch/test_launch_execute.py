"""Executing a plan with real processes: exit codes, the failure tail, SIGTERM forwarding, no orphans."""

from __future__ import annotations

import contextlib
import io
import os
import resource
import signal
import sys
import time
from pathlib import Path

import pytest

from launch_helpers import WORKERS, is_gone, read_reports, run_launch, start_launch
from torchpace.launch.execute import execute, render_failure
from torchpace.launch.plan import LaunchPlan, Setting, Source

_WAIT_S = 60


def _wait_for(paths: list[Path], proc, timeout_s: float = _WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f"launch ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, f"workers never wrote {paths}"
        time.sleep(0.1)


def _pids(out_dir: Path) -> list[int]:
    return [int(pid) for p in sorted(out_dir.glob("pids-*.txt")) for pid in p.read_text().split()]


def _plan(argv: list[str], nofile: int | None = None) -> LaunchPlan:
    return LaunchPlan(tuple(argv), dict(os.environ), (Setting("launcher", "exec", Source.DEFAULT, "test"),),
                      script=argv[-1], nofile=nofile)


def test_execute_returns_exit_code_and_repeats_stderr_tail(tmp_path):
    sink = io.BytesIO()
    code = execute(_plan([sys.executable, str(WORKERS / "exit_with.py"), "3"]), stderr=sink)
    text = sink.getvalue().decode()
    assert code == 3
    assert text.count("marker: rank 0 fails with 3") == 2  # passed through live, then in the summary
    assert "failed with exit code 3; its last stderr lines:" in text


def test_execute_raises_nofile_in_the_child_only(tmp_path):
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = execute(_plan([sys.executable, str(WORKERS / "rank_report.py"), str(tmp_path)], nofile=1000), stderr=io.BytesIO())
    assert code == 0
    assert read_reports(tmp_path)[0]["nofile"][0] == 1000
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == before


def test_failure_text_names_the_signal_and_the_exit_code():
    assert "killed by signal 9 (SIGKILL); exit code 137" in render_failure("x.py", -9, b"")


def test_cli_propagates_exit_code_of_plain_script(child_env):
    result = run_launch(["--", str(WORKERS / "exit_with.py"), "5"], child_env)
    assert result.returncode == 5, result.stderr
    assert "exit_with.py failed with exit code 5" in result.stderr
    killed = run_launch([str(WORKERS / "exit_with.py"), "kill"], child_env)
    assert killed.returncode == 137 and "SIGKILL" in killed.stderr


def test_cli_propagates_failed_rank_exit_code_through_torchrun(child_env):
    result = run_launch(["--nproc-per-node", "2", "--", str(WORKERS / "exit_with.py"), "7", "1"], child_env)
    assert result.returncode == 7, result.stderr[-3000:]
    assert "marker: rank 1 fails with 7" in result.stderr
    assert "exit code 7" in result.stderr


@pytest.mark.parametrize("nproc", [1, 2], ids=["exec", "torchrun"])
def test_sigterm_reaches_every_child_and_leaves_no_orphan(tmp_path, child_env, nproc):
    proc = start_launch(["--nproc-per-node", str(nproc), "--", str(WORKERS / "sleeper.py"), str(tmp_path)], child_env)
    try:
        _wait_for([tmp_path / f"pids-{rank}.txt" for rank in range(nproc)], proc)
        pids = _pids(tmp_path)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=_WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    deadline = time.monotonic() + 10
    while not all(is_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in pids if not is_gone(pid)] == []


def test_script_is_terminated_when_torchpace_is_killed_outright(tmp_path, child_env):
    proc = start_launch(["--", str(WORKERS / "sleeper.py"), str(tmp_path)], child_env)
    grandchild_pid = None
    try:
        _wait_for([tmp_path / "pids-0.txt"], proc)
        script_pid, grandchild_pid = _pids(tmp_path)
        proc.kill()  # SIGKILL: nothing can be forwarded
        proc.wait(timeout=_WAIT_S)
        deadline = time.monotonic() + 10
        while not is_gone(script_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert is_gone(script_pid)
    finally:
        proc.kill()
        if grandchild_pid is not None:
            with contextlib.suppress(ProcessLookupError):  # the script's own child is the script's business
                os.kill(grandchild_pid, signal.SIGKILL)
        proc.communicate()


def test_a_second_signal_kills_a_script_that_ignores_the_first(tmp_path, child_env):
    proc = start_launch(["--", str(WORKERS / "sleeper.py"), str(tmp_path), "--ignore-term"], child_env)
    try:
        _wait_for([tmp_path / "pids-0.txt"], proc)
        pids = _pids(tmp_path)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None  # the script ignores SIGTERM: still running
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=_WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGKILL and "SIGKILL" in stderr
    assert [pid for pid in pids if not is_gone(pid)] == []
