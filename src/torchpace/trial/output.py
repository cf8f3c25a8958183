"""A script-mode trial's own output: its stdout and stderr kept together in one log file (where a user
finds what their script printed: its prints, Lightning's or the Trainer's progress), and, on request,
shown as it comes (`--show-output`).

The log is a plain file the script's process writes to directly (both streams, as a terminal would
interleave them), so nothing is lost when the process is ended and no pipe can block it; showing it
is a thread that follows the file.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import TextIO

from torchpace.launch.command import parse_python_command

LOG_DIR = Path(".torchpace") / "logs"  # beside the default study storage, relative to the working folder
_FOLLOW_POLL_S = 0.1  # how often a followed log is read for new output
_PLAIN_MAX = 128  # characters of a study's name kept in its log folder's name (a folder's name holds 255 bytes)
_PLAIN_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{_PLAIN_MAX - 1}}}")  # a study name its folder keeps as it is
_DIGEST_CHARS = 12  # hex digits of the name's SHA-256 beside a changed name: 48 bits, no two names of a project meet


def plan_log_path(verb: str, command: list[str] | tuple[str, ...], root: Path = LOG_DIR, now: datetime | None = None,
                  pid: int | None = None) -> Path:
    """`.torchpace/logs/VERB-SCRIPT-YYYYmmdd-HHMMSS-PID.log` for one `bench` or `profile` of `command`."""
    program = parse_python_command(command)
    name = Path(program.name).stem if program.training.script else program.name
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return root / f"{verb}-{_safe(name)[:_PLAIN_MAX]}-{stamp}-{pid or os.getpid()}.log"


def trial_log_path(study: str, number: int, root: Path = LOG_DIR) -> Path:
    """`.torchpace/logs/STUDY/trial-N.log`: the output of trial N of a script study (`study_log_folder`)."""
    return root / study_log_folder(study) / f"trial-{number}.log"


def study_log_folder(study: str) -> str:
    """The name of a study's log folder: the study's name when a folder can have it as it is (letters,
    digits, `_.-`, not leading with `.` or `-`, at most `_PLAIN_MAX` characters), else its readable part
    with a digest of the whole name (`my_study~1f2e3d4c5b6a`), so no two study names share a folder and
    none is hidden, `.`, `..` or too long. A plain name never holds `~`, so it never meets a digested one."""
    if _PLAIN_NAME.fullmatch(study):
        return study
    digest = hashlib.sha256(study.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS]
    return f"{_safe(study).lstrip('.-')[:_PLAIN_MAX] or 'study'}~{digest}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "script"


class follow:
    """Copy what is appended to `path` to `sink` while the block runs, and the rest when it ends."""

    def __init__(self, path: Path, sink: TextIO | None):
        self.path, self.sink = Path(path), sink
        self.offset = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character split across reads
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> "follow":
        if self.sink is not None:
            self.thread = threading.Thread(target=self._run, name="torchpace-follow-output", daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.thread is not None:
            self.done.set()
            self.thread.join()

    def _run(self) -> None:
        while not self.done.is_set():
            self._copy()
            time.sleep(_FOLLOW_POLL_S)
        self._copy()

    def _copy(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        if data:
            self.offset += len(data)
            self.sink.write(self.decoder.decode(data))
            self.sink.flush()
