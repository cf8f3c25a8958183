"""Run a LaunchPlan: the command in its own process group, signals forwarded, the exit code returned.

The child starts in a new session, so torchpace alone decides what reaches it: SIGINT (Ctrl-C),
SIGTERM and SIGHUP sent to torchpace are forwarded to the child's whole process group (torchrun then
shuts its workers down itself). A second signal, or a child still alive `_SHUTDOWN_GRACE_S` after
the first, gets the group and every descendant killed. The child's stderr is passed through as it
comes and its last lines are kept, to be repeated with the exit code when the script fails.
RLIMIT_NOFILE is raised in the child only (between fork and exec), never in torchpace itself; there the
child also asks for SIGTERM should torchpace die without forwarding anything (kill -9).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

from torchpace.errors import TorchpaceError
from torchpace.launch.plan import LaunchPlan
from torchpace.trial.runner import kill_process_group

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_SHUTDOWN_GRACE_S = 45.0  # after a forwarded signal; torchrun itself gives its workers 30 s
_POLL_S = 0.25  # how often the wait checks whether the grace period is over
_TAIL_LINES = 20  # stderr lines repeated when the script fails
_TAIL_BYTES = 16384  # enough for _TAIL_LINES lines of a traceback
_READ_BYTES = 65536
# How long to keep copying stderr after the child exited: a process it started in a session of its
# own (outside the group we clean up) may hold the pipe open for as long as it lives.
_DRAIN_S = 5.0
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def execute(plan: LaunchPlan, stderr: BinaryIO | None = None) -> int:
    """Run the plan's command and return its exit code (128 + N when signal N ended it).

    Args:
        plan: what to run (argv, env, the child's RLIMIT_NOFILE).
        stderr: where the child's stderr and torchpace's failure summary go (default: ours).

    Returns:
        The script's exit code; under torchrun, the exit code of the first rank that failed.

    Raises:
        TorchpaceError: the command could not be started at all.
    """
    sink = stderr if stderr is not None else sys.stderr.buffer
    proc = _start(plan)
    tail = bytearray()
    tee = threading.Thread(target=_tee, args=(proc.stderr, sink, tail), name="torchpace-launch-stderr", daemon=True)
    tee.start()
    try:
        with forwarding_signals(proc) as forwarded:
            returncode = _wait(proc, forwarded)
    finally:
        kill_process_group(proc)  # anything the script left behind in its group
        tee.join(timeout=_DRAIN_S)
    if returncode:
        sink.write(render_failure(plan.script, returncode, bytes(tail)).encode())
        sink.flush()
    return exit_status(returncode)


def _start(plan: LaunchPlan) -> subprocess.Popen:
    try:
        return subprocess.Popen(list(plan.argv), env=dict(plan.env), stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=_child_setup(plan.nofile))
    except OSError as err:
        raise TorchpaceError(f"cannot start {plan.argv[0]!r}: {err.strerror}") from None


def _child_setup(nofile: int | None) -> Callable[[], None]:
    """What the child does between fork and exec: its soft RLIMIT_NOFILE, and SIGTERM when we die.

    Linux sends PR_SET_PDEATHSIG's signal when torchpace dies, even by SIGKILL, which cannot be
    forwarded: the script, or torchrun with its workers, then shuts down instead of living on.
    Everything is loaded before the fork; the child only makes system calls.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def setup() -> None:
        if nofile is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # torchpace died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return setup


def _tee(source: BinaryIO, sink: BinaryIO, tail: bytearray) -> None:
    """Copy the child's stderr to `sink` as it comes, keeping its last bytes in `tail`."""
    fd, writing = source.fileno(), True
    while chunk := os.read(fd, _READ_BYTES):
        tail += chunk
        del tail[:-_TAIL_BYTES]
        if writing:
            try:
                sink.write(chunk)
                sink.flush()
            except OSError:  # our stderr is gone (closed pipe): keep draining so the child never blocks
                writing = False
    source.close()


@dataclass
class _Forwarded:
    """Signals forwarded to the child so far."""

    count: int = 0
    first_at: float | None = None

    def record(self) -> None:
        self.count += 1
        self.first_at = self.first_at or time.monotonic()

    def should_kill(self) -> bool:
        """True after a second signal, or when the child outlived the grace period."""
        overdue = self.first_at is not None and time.monotonic() - self.first_at > _SHUTDOWN_GRACE_S
        return self.count >= 2 or overdue


@contextlib.contextmanager
def forwarding_signals(proc: subprocess.Popen) -> Iterator[_Forwarded]:
    """While inside, SIGINT/SIGTERM/SIGHUP to this process go to `proc`'s process group instead.

    A signal torchpace was told to ignore (SIGHUP under nohup) stays ignored. Handlers can only be
    installed from the main thread; elsewhere nothing is forwarded.
    """
    forwarded = _Forwarded()
    if threading.current_thread() is not threading.main_thread():
        yield forwarded
        return

    def forward(signum: int, frame: object) -> None:
        forwarded.record()
        with contextlib.suppress(ProcessLookupError):  # the group has already exited
            os.killpg(proc.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield forwarded
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(proc: subprocess.Popen, forwarded: _Forwarded) -> int:
    while True:
        try:
            return proc.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            if forwarded.should_kill():
                kill_tree(proc)
                return proc.wait()


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`'s process group and every descendant, also those in other sessions.

    Used once SIGTERM was already forwarded and not enough. torchrun starts each worker in a session
    of its own, so killing the group alone would orphan them.
    """
    import psutil

    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    with contextlib.suppress(ProcessLookupError):  # the group has already exited
        os.killpg(proc.pid, signal.SIGKILL)
    for child in descendants:
        with contextlib.suppress(psutil.NoSuchProcess):  # it exited with its parent
            child.kill()


def exit_status(returncode: int) -> int:
    """A child's return code as a shell exit status: signal N (returncode -N) becomes 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


def render_failure(script: str, returncode: int, stderr_tail: bytes) -> str:
    """The failure summary: how the script ended and its last stderr lines."""
    if returncode < 0:
        how = f"was killed by signal {_signal_name(-returncode)}; exit code {exit_status(returncode)}"
    else:
        how = f"failed with exit code {returncode}"
    lines = stderr_tail.decode(errors="replace").splitlines()[-_TAIL_LINES:]
    text = f"torchpace launch: {script} {how}"
    if lines:
        text += "; its last stderr lines:\n" + "\n".join(f"  | {line}" for line in lines)
    return text + "\n"


def _signal_name(signum: int) -> str:
    try:
        return f"{signum} ({signal.Signals(signum).name})"
    except ValueError:  # a real-time or unknown signal has no name
        return str(signum)
