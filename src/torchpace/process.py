"""Child processes: start one in a session of its own that dies with us, forward our signals to it,
stop its whole tree, and report how it ended as a shell would.

One toolkit for every child torchpace starts (trials, `launch`, `monitor`, doctor's probes):

- `start_child` starts argv in a new session, so it leads its own process group and only what we
  forward reaches it. Between fork and exec the child asks Linux to send it `death_signal` when we
  die, even by SIGKILL (`PR_SET_PDEATHSIG`); libc is loaded before the fork so the child only makes
  system calls, and a parent that died before the request took effect is noticed (`getppid()`
  changed) and answered with the same signal. `die_with_parent` does the same inside a running
  process (each torchrun rank of a trial).
- `SignalForwarder` passes SIGINT, SIGTERM and SIGHUP on to the child's group. Its handlers go in
  before the child starts: a signal that arrives before the group exists is sent once it does.
  After a second signal, or `grace_s` after the first, the whole tree is killed.
- `stop_tree` sends SIGTERM to the group and to every other process of the tree (descendants that
  started sessions of their own, as torchrun's ranks do, and processes seen in it earlier), and
  SIGKILL to whatever is left `grace_s` later; `kill_tree` is the SIGKILL alone.
- `exit_code`: a return code -N (ended by signal N) becomes 128 + N.

This module imports only the standard library at load; psutil is imported when a tree is walked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from torchpace.logs import EnvChanges

if TYPE_CHECKING:
    import psutil

_log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it: ended by signal N (returncode -N) becomes 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


# --------------------------------------------------------------------------- starting a child


def start_child(argv: Sequence[str], death_signal: int | None = signal.SIGKILL, nofile: int | None = None,
                **popen: Any) -> subprocess.Popen:
    """Start `argv` in a new session (its own process group) that gets `death_signal` when we die.

    Args:
        argv: the command, no shell.
        death_signal: what the child gets when this process dies (None: nothing).
        nofile: the child's soft RLIMIT_NOFILE (None: inherited); set in the child only.
        **popen: passed on to `subprocess.Popen` (env, stdin, stdout, stderr, text, ...).

    Raises:
        OSError: the command could not be started (FileNotFoundError when it does not exist).
    """
    _log.debug("starting %s; environment changes: %s", shlex.join(map(str, argv)), EnvChanges(popen.get("env")))
    return subprocess.Popen(list(argv), start_new_session=True, preexec_fn=child_setup(death_signal, nofile), **popen)


def child_setup(death_signal: int | None, nofile: int | None = None, parent_pid: int | None = None) -> Callable[[], None]:
    """What a child does between fork and exec: its RLIMIT_NOFILE, and `death_signal` when we die.

    Everything is loaded here, before the fork (Python may not import safely in a forked child
    while other threads run); the returned function only makes system calls.

    Args:
        death_signal: signal to ask for when the parent dies (None: no request).
        nofile: the child's soft RLIMIT_NOFILE (None: unchanged).
        parent_pid: the parent the child must find after its request (default: this process).
    """
    libc = _libc() if death_signal is not None else None
    parent = os.getpid() if parent_pid is None else parent_pid

    def setup() -> None:
        if nofile is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
        if libc is not None:
            _ask_for_death_signal(libc, death_signal, parent)

    return setup


def die_with_parent(death_signal: int = signal.SIGKILL) -> None:
    """In a running process: get `death_signal` when the parent dies, even by SIGKILL.

    A parent that died before this call is noticed only if it died after `getppid()` was first read.
    """
    _ask_for_death_signal(_libc(), death_signal, os.getppid())


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _ask_for_death_signal(libc: Any, death_signal: int, parent: int) -> None:
    libc.prctl(_PR_SET_PDEATHSIG, death_signal)
    if os.getppid() != parent:  # the parent died before the request took effect: no signal will come
        os.kill(os.getpid(), death_signal)


# --------------------------------------------------------------------------- stopping a tree


def signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to process group `pgid`; False when the group is empty (or not ours)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def tree_members(pid: int, known: Iterable[psutil.Process] = ()) -> list[psutil.Process]:
    """The live processes of `pid`'s tree other than `pid`: its descendants, the members of its
    process group `pid` (left behind when their parent exited), and `known` processes still running
    (seen in the tree earlier; a descendant that started a session of its own leaves the group)."""
    import psutil

    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        found.update((p.pid, p) for p in psutil.Process(pid).children(recursive=True))
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(proc.pid) == pid:
                found.setdefault(proc.pid, proc)
    for proc in known:
        found.setdefault(proc.pid, proc)
    return [p for p in found.values() if p.pid != pid and _is_live(p)]


def _is_live(proc: psutil.Process) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(pid: int, members: Iterable[psutil.Process] | None = None) -> None:
    """SIGKILL process group `pid` and every other member of the tree (default: `tree_members(pid)`)."""
    import psutil

    members = tree_members(pid) if members is None else members
    signal_group(pid, signal.SIGKILL)
    for proc in members:
        with contextlib.suppress(psutil.Error):  # it exited meanwhile; psutil checks the pid was not reused
            proc.kill()


def stop_tree(proc: subprocess.Popen, grace_s: float, known: Iterable[psutil.Process] = ()) -> int:
    """SIGTERM `proc`'s group and the rest of its tree, then SIGKILL what is left after `grace_s`.

    `proc` itself is waited for (so its return code is kept); it may have exited already, and then
    only what it left behind is stopped.

    Args:
        proc: the child started by `start_child` (it leads its process group).
        grace_s: seconds between SIGTERM and SIGKILL.
        known: processes seen in the tree earlier (see `tree_members`).

    Returns:
        How many processes besides `proc` were found running.
    """
    import psutil

    members = tree_members(proc.pid, known)
    if proc.poll() is not None and not members:
        return 0
    signal_group(proc.pid, signal.SIGTERM)
    for member in members:
        with contextlib.suppress(psutil.Error):
            member.terminate()
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    _, alive = psutil.wait_procs(members, timeout=max(0.0, deadline - time.monotonic()))
    kill_tree(proc.pid, alive)
    proc.wait()
    psutil.wait_procs(alive, timeout=grace_s)
    return len(members)


# --------------------------------------------------------------------------- forwarding signals


@dataclass
class SignalForwarder:
    """Forwards the signals this process receives to a child's process group.

    The child runs in its own session, so Ctrl-C at the terminal reaches only us; this passes it on.
    After a second signal, or when the child is still running `grace_s` after the first,
    `escalate_if_due` kills the child's whole tree. The handlers go in before the child starts
    (`pgid` None): what arrives before `attach` is passed on as soon as the child's group is known.

    Attributes:
        pgid: the child's process group (its pid), None until `attach`.
        grace_s: seconds after the first signal before the tree is killed.
        clock: monotonic seconds; injectable for tests.
        received: names of the signals received, in order, and the escalation when it happened.
        killed: the tree was killed.
    """

    pgid: int | None
    grace_s: float
    clock: Callable[[], float] = time.monotonic
    received: list[str] = field(default_factory=list)
    first_at_s: float | None = None
    killed: bool = False
    _pending: list[int] = field(default_factory=list)

    def handle(self, signum: int, frame: Any = None) -> None:
        """The signal handler: record `signum` and pass it on (or keep it until `attach`)."""
        self.received.append(signal.Signals(signum).name)
        if self.first_at_s is None:
            self.first_at_s = self.clock()
        if self.pgid is None:
            self._pending.append(signum)
        else:
            signal_group(self.pgid, signum)

    def attach(self, pgid: int) -> None:
        """The child started in group `pgid`: forward from now on, and what arrived while it was starting."""
        self.pgid = pgid
        while self._pending:
            signal_group(pgid, self._pending.pop(0))

    def escalate_if_due(self) -> None:
        """Kill the child's tree after a second signal, or `grace_s` after the first."""
        if self.first_at_s is None or self.killed or self.pgid is None:
            return
        signals = len(self.received)
        if signals < 2 and self.clock() - self.first_at_s < self.grace_s:
            return
        self.killed = True
        kill_tree(self.pgid)
        reason = "a second signal" if signals >= 2 else f"still running {self.grace_s:g} s after the first signal"
        self.received.append(f"SIGKILL ({reason})")

    @contextlib.contextmanager
    def installed(self) -> Iterator[SignalForwarder]:
        """Install the handlers (main thread only; elsewhere nothing is forwarded). A signal this process
        was told to ignore (SIGHUP under nohup) stays ignored."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in FORWARDED_SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    previous[signum] = signal.signal(signum, self.handle)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def wait(self, proc: subprocess.Popen, poll_s: float) -> int:
        """Wait for `proc` to exit, escalating every `poll_s` seconds when due; its return code."""
        while True:
            try:
                return proc.wait(timeout=poll_s)
            except subprocess.TimeoutExpired:
                self.escalate_if_due()


# --------------------------------------------------------------------------- stopped groups

# The guardian: a bare interpreter (no site, no torchpace) that reads `+PGID` / `-PGID` lines, and when
# its stdin ends without `done` (the process that started it is gone, however it died), SIGKILLs every
# group it still holds. SIGKILL is the one signal a stopped process cannot leave pending.
_GUARDIAN = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    word = line.strip()
    if word == "done":
        sys.exit(0)
    if word[:1] in "+-" and word[1:].isdigit():
        (groups.add if word[0] == "+" else groups.discard)(int(word[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class StoppedGroupGuard:
    """Kills the process groups this process holds stopped (SIGSTOP) should it die, even by SIGKILL.

    A stopped group outliving torchpace would stay stopped for ever: its leader dies by the parent-death
    signal, but its other members (DataLoader workers) are not children of torchpace and a stopped
    process acts on no signal but SIGKILL. The guard is a small process in a session of its own whose
    stdin is a pipe from this process: the pipe ends when this process dies, however it dies, and the
    guardian then SIGKILLs every group still registered. Use it as a context manager; `hold(pgid)`
    before a group can be stopped, `release(pgid)` once it is gone.
    """

    def __enter__(self) -> StoppedGroupGuard:
        import sys

        self._proc = subprocess.Popen([sys.executable, "-S", "-c", _GUARDIAN], stdin=subprocess.PIPE,
                                      start_new_session=True, text=True)
        return self

    def hold(self, pgid: int) -> None:
        self._say(f"+{pgid}")

    def release(self, pgid: int) -> None:
        self._say(f"-{pgid}")

    def _say(self, word: str) -> None:
        self._proc.stdin.write(word + "\n")
        self._proc.stdin.flush()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):  # a guardian that died already (killed from outside) holds nothing
            self._say("done")
            self._proc.stdin.close()
        self._proc.wait()
