"""Run a LaunchPlan: the command in its own process group, signals forwarded, the exit code returned.

The child starts in a new session, so torchpace alone decides what reaches it: SIGINT (Ctrl-C),
SIGTERM and SIGHUP sent to torchpace are forwarded to the child's whole process group (torchrun then
shuts its workers down itself). A second signal, or a child still alive `_SHUTDOWN_GRACE_S` after
the first, gets the group and every descendant killed. The child's stderr is passed through as it
comes and its last lines are kept, to be repeated with the exit code when the script fails.
RLIMIT_NOFILE is raised in the child only (between fork and exec), never in torchpace itself; there the
child also asks for SIGTERM should torchpace die without forwarding anything (kill -9). Starting,
forwarding and stopping are `torchpace.process`'s.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from typing import BinaryIO

from torchpace.errors import TorchpaceError
from torchpace.launch.plan import LaunchPlan
from torchpace.process import SignalForwarder, exit_code, start_child, stop_tree

_log = logging.getLogger(__name__)

_SHUTDOWN_GRACE_S = 45.0  # after a forwarded signal; torchrun itself gives its workers 30 s
_LEFTOVER_GRACE_S = 3.0  # what the script left running gets this long between SIGTERM and SIGKILL
_POLL_S = 0.25  # how often the wait checks whether the grace period is over
_TAIL_LINES = 20  # stderr lines repeated when the script fails
_TAIL_BYTES = 16384  # enough for _TAIL_LINES lines of a traceback
_READ_BYTES = 65536
# How long to keep copying stderr after the child exited: a process it started in a session of its
# own (outside the group we clean up) may hold the pipe open for as long as it lives.
_DRAIN_S = 5.0


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
    for setting in plan.settings:
        _log.info("%s = %s (%s: %s)", setting.name, setting.value, setting.source.value, setting.reason)
    forwarder = SignalForwarder(None, _SHUTDOWN_GRACE_S)
    with forwarder.installed():  # from before the start: a signal meanwhile is forwarded once the child exists
        proc = _start(plan)
        forwarder.attach(proc.pid)
        tail = bytearray()
        tee = threading.Thread(target=_tee, args=(proc.stderr, sink, tail), name="torchpace-launch-stderr", daemon=True)
        tee.start()
        try:
            returncode = forwarder.wait(proc, _POLL_S)
        finally:
            stop_tree(proc, _LEFTOVER_GRACE_S)  # anything the script left behind
            tee.join(timeout=_DRAIN_S)
    _log.info("%s (pid %d) ended with exit status %d", plan.script, proc.pid, returncode)
    if returncode:
        sink.write(render_failure(plan.script, returncode, bytes(tail)).encode())
        sink.flush()
    return exit_code(returncode)


def _start(plan: LaunchPlan) -> subprocess.Popen:
    """The script in a session of its own, with its RLIMIT_NOFILE, getting SIGTERM should torchpace die
    without forwarding anything (kill -9): the script, or torchrun with its workers, then shuts down."""
    try:
        return start_child(plan.argv, death_signal=signal.SIGTERM, nofile=plan.nofile, env=dict(plan.env),
                           stderr=subprocess.PIPE)
    except OSError as err:
        raise TorchpaceError(f"cannot start {plan.argv[0]!r}: {err.strerror}") from None


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


def render_failure(script: str, returncode: int, stderr_tail: bytes) -> str:
    """The failure summary: how the script ended and its last stderr lines."""
    if returncode < 0:
        how = f"was killed by signal {_signal_name(-returncode)}; exit code {exit_code(returncode)}"
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
