"""Child processes: start one in a session of its own whose whole tree dies with us, forward our signals
to it, stop its whole tree, and report how it ended as a shell would.

One toolkit for every child torchpace starts (trials, `launch`, `monitor`, doctor's probes):

- `start_child` starts argv in a new session under a *keeper* (`torchpace._keeper`), a small
  stdlib-only process that stays outside that session (the child leads its own session and process
  group, so `KeptChild.pid` is the child's), adopts every process of the tree whose parent dies (a child subreaper, so nothing of the tree is lost: daemons in sessions of their own
  included), reports the child's start and exit on a pipe (the returned `KeptChild` waits for the child,
  not for the keeper), and, when we die, even by SIGKILL (its parent-death signal), sends the child's
  `death_signal` to the whole tree and SIGKILL to what is left 3 s later. `die_with_parent` asks for
  the parent-death signal inside a running process (each torchrun rank of a trial).
- `SignalForwarder` passes SIGINT, SIGTERM and SIGHUP on to the child's group. Its handlers go in
  before the child starts: a signal that arrives before the group exists is sent once it does.
  After a second signal, or `grace_s` after the first, the whole tree is killed.
- `stop_tree` sends SIGTERM to the group and to every other process of the tree (descendants that
  started sessions of their own, as torchrun's ranks do, and processes seen in it earlier), and
  SIGKILL to whatever is left `grace_s` later; `kill_tree` is the SIGKILL alone.
- `exit_code`: a return code -N (ended by signal N) becomes 128 + N.
- `kill_live_children`: SIGKILL the tree of every child started here that still runs (what the stop-signal
  policy, `torchpace.stop_policy`, does on a second stop or an emergency).

This module imports only the standard library at load; psutil is imported when a tree is walked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import resource
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from torchpace.logs import EnvChanges

if TYPE_CHECKING:
    import psutil

_log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_KEEPER_PATH = Path(__file__).with_name("_keeper.py")
_KEEPER_SPEC_ENV = "TORCHPACE_KEEPER_SPEC"  # the keeper's instructions (it takes them out of the child's env)
_ORPHAN_GRACE_S = 3.0  # when torchpace dies, its children's trees get this long after their death signal
_LIVE_CHILDREN: weakref.WeakSet = weakref.WeakSet()  # every child started here (emergency stop: `stop_signals_raise`)
_UNREAPED_KEEPERS: list = []  # keepers whose child has ended, still to be collected


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it: ended by signal N (returncode -N) becomes 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


# --------------------------------------------------------------------------- starting a child


def start_child(argv: Sequence[str], death_signal: int | None = signal.SIGKILL, nofile: int | None = None,
                grace_s: float = _ORPHAN_GRACE_S, **popen: Any) -> subprocess.Popen:
    """Start `argv` in a new session (its own process group) under a keeper (`torchpace._keeper`), so its
    whole tree ends with us.

    The returned `KeptChild` is the child as Popen shows a child (`pid` leads the child's group). Every
    process of the tree that loses its parent is adopted by the keeper (`KeptChild.adopted`, so
    `stop_tree` finds them all, also in sessions of their own). When this process dies, even by SIGKILL,
    the keeper sends `death_signal` to every process of the tree and SIGKILL to what is left `grace_s`
    later. It costs one small interpreter (about 0.1 s to start, 10 MB) per child.

    Args:
        argv: the command, no shell.
        death_signal: what the tree gets when this process dies (None: SIGKILL).
        nofile: the child's soft RLIMIT_NOFILE (None: inherited); set in the child's processes only.
        grace_s: after `death_signal`, how long the tree has before SIGKILL.
        **popen: passed on to `subprocess.Popen` (env, cwd, stdin, stdout, stderr, text, ...).

    Raises:
        OSError: the command could not be started (FileNotFoundError when it does not exist).
    """
    _log.debug("starting %s; environment changes: %s", shlex.join(map(str, argv)), EnvChanges(popen.get("env")))
    _reap_keepers()
    env = dict(os.environ if popen.get("env") is None else popen["env"])
    read_end, write_end = os.pipe()
    env[_KEEPER_SPEC_ENV] = json.dumps({"argv": list(argv), "death_signal": int(death_signal or signal.SIGKILL),
                                        "grace_s": grace_s, "parent": os.getpid(), "status_fd": write_end})
    popen = {**popen, "env": env, "pass_fds": (*popen.get("pass_fds", ()), write_end)}
    try:
        proc = KeptChild([sys.executable, "-I", "-S", str(_KEEPER_PATH)], start_new_session=True,
                         preexec_fn=child_setup(signal.SIGTERM, nofile), **popen)
    finally:
        os.close(write_end)
    proc.attach_status(read_end, list(argv))  # from here on, `proc.pid` is the child's
    proc.args = list(argv)
    _LIVE_CHILDREN.add(proc)
    return proc


class KeptChild(subprocess.Popen):
    """A child under its keeper, as `start_child` returns it. `pid` is the child's own: it leads its session
    and process group, so signals to the group and `psutil.Process(pid)` are the child's, as for any
    child; the keeper (`keeper_pid`) stays outside that group. `wait`, `poll` and `returncode` follow the
    child, as the keeper reports them on its status pipe; `send_signal` (and so `terminate`, `kill`)
    signals the child's group; `adopted()` lists what the keeper took in (the tree's orphans)."""

    _status_fd: int | None = None
    _status_buffer = b""
    keeper_pid: int | None = None

    @property
    def child_pid(self) -> int:
        return self.pid

    def attach_status(self, fd: int, argv: list[str]) -> None:
        """Read the keeper's first word: the child started (its pid becomes `pid`), or exec failed
        (raised as OSError here, as Popen raises it)."""
        self._status_fd, self.keeper_pid = fd, self.pid
        try:
            line = self._read_status_line(None)
        except BaseException:  # interrupted while the keeper starts: leave nothing behind
            self._kill_keeper_tree()
            raise
        word, _, value = (line or "").partition(" ")
        if word == "started":
            self.pid = int(value)
            return
        self._collect_keeper_exit()
        code = int(value) if word == "failed" and value.isdigit() else errno.ECHILD
        raise OSError(code, os.strerror(code), argv[0])

    def _read_status_line(self, timeout: float | None) -> str | None:
        """The next line from the keeper; "" at end of file (the keeper is gone); None on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._status_buffer:
            if self._status_fd is None:
                return ""
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            waiting = select.poll()  # not select(): a process may hold more than 1024 descriptors
            waiting.register(self._status_fd, select.POLLIN)
            if not waiting.poll(None if left is None else left * 1000):
                return None
            chunk = os.read(self._status_fd, 4096)
            if not chunk:
                self._close_status()
                return ""
            self._status_buffer += chunk
        line, _, self._status_buffer = self._status_buffer.partition(b"\n")
        return line.decode()

    def _close_status(self) -> None:
        if self._status_fd is not None:
            os.close(self._status_fd)
            self._status_fd = None

    def _child_status(self, timeout: float | None) -> int | None:
        """The child's return code once the keeper reports it (or the keeper's own, when it died first)."""
        while self.returncode is None:
            line = self._read_status_line(timeout)
            if line is None:
                return None
            if line.startswith("exited "):
                self.returncode = os.waitstatus_to_exitcode(int(line.split()[1]))
                _UNREAPED_KEEPERS.append(self)
            elif line == "":  # the keeper ended without a word on the child (killed with it): its own code
                self.returncode = self._collect_keeper_exit()
        return self.returncode

    def _collect_keeper_exit(self) -> int:
        """Wait for the keeper to exit; its return code."""
        self._close_status()
        try:
            _, status = os.waitpid(self.keeper_pid, 0)
        except ChildProcessError:  # collected already
            return -signal.SIGKILL
        return os.waitstatus_to_exitcode(status)

    def _internal_poll(self, _deadstate=None, **_):
        if self.returncode is None:
            self._child_status(0)
        return self.returncode

    def _wait(self, timeout):
        if self._child_status(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            signal_group(self.pid, sig)

    def adopted(self) -> list[psutil.Process]:
        """Every live process below the keeper (the child's tree, and the orphans it adopted)."""
        # lazy: every command loads this module at start-up; what else it needs loads where it is used
        import psutil

        try:
            return psutil.Process(self.keeper_pid).children(recursive=True)
        except psutil.Error:
            return []

    def reap_keeper(self, timeout: float | None = 0) -> bool:
        """Collect the keeper's own exit (it stays while anything of the tree runs); True once it is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                pid, _ = os.waitpid(self.keeper_pid, os.WNOHANG)
            except ChildProcessError:  # already collected
                pid = self.keeper_pid
            if pid == self.keeper_pid:
                self._close_status()
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def _kill_keeper_tree(self) -> None:
        """SIGKILL the keeper's whole tree and the keeper, and collect it."""
        # lazy: every command loads this module at start-up; what else it needs loads where it is used
        import psutil

        for process in self.adopted():
            with contextlib.suppress(psutil.Error):
                process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.keeper_pid, signal.SIGKILL)
        self.reap_keeper(None)


def _reap_keepers() -> None:
    """Collect the keepers whose trees have ended (each start does it, as `subprocess` does for its children)."""
    _UNREAPED_KEEPERS[:] = [proc for proc in _UNREAPED_KEEPERS if not proc.reap_keeper(0)]


def owner_pid(pid: int | None = None) -> int:
    """The process that started this one (or process `pid`): its parent, or past a keeper, the process that started
    the keeper."""
    parent = os.getppid() if pid is None else _parent_of(pid)
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            is_keeper = _KEEPER_PATH.name.encode() in cmdline.read()
        if is_keeper:
            with open(f"/proc/{parent}/stat", "rb") as stat:
                return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return parent


def _parent_of(pid: int) -> int:
    """Process `pid`'s parent (`pid` itself when it cannot be read: it ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return pid


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
    # lazy: every command loads this module at start-up; what else it needs loads where it is used
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
    # lazy: every command loads this module at start-up; what else it needs loads where it is used
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
    # lazy: every command loads this module at start-up; what else it needs loads where it is used
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(pid: int, members: Iterable[psutil.Process] | None = None) -> None:
    """SIGKILL process group `pid` and every other member of the tree (default: `tree_members(pid)`)."""
    # lazy: every command loads this module at start-up; what else it needs loads where it is used
    import psutil

    members = tree_members(pid) if members is None else members
    signal_group(pid, signal.SIGKILL)
    for proc in members:
        with contextlib.suppress(psutil.Error):  # it exited meanwhile; psutil checks the pid was not reused
            proc.kill()


def stop_tree(proc: subprocess.Popen, grace_s: float, known: Iterable[psutil.Process] = ()) -> int:
    """SIGTERM `proc`'s group and the rest of its tree, then SIGKILL what is left after `grace_s`.

    `proc` itself is waited for (so its return code is kept); it may have exited already, and then
    only what it left behind is stopped. A child under a keeper (`start_child`) has its keeper
    collected too, once the tree is empty.

    Args:
        proc: the child started by `start_child` (it leads its process group).
        grace_s: seconds between SIGTERM and SIGKILL.
        known: processes seen in the tree earlier (see `tree_members`).

    Returns:
        How many processes besides the child itself were found running.
    """
    # lazy: every command loads this module at start-up; what else it needs loads where it is used
    import psutil

    adopted = proc.adopted() if isinstance(proc, KeptChild) else []  # orphans of the tree, in other sessions too
    members = tree_members(proc.pid, [*known, *adopted])
    left = len(members)
    if proc.poll() is not None and not members:
        _collect_keeper(proc, grace_s)
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
    _collect_keeper(proc, grace_s)
    return left


def _collect_keeper(proc: subprocess.Popen, grace_s: float) -> None:
    """A keeper leaves once its tree is empty; one that stays longer than `grace_s` (something was
    started after the tree was listed) is killed with whatever is left."""
    if isinstance(proc, KeptChild) and not proc.reap_keeper(grace_s):
        proc._kill_keeper_tree()


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
        # lazy: every command loads this module at start-up; what else it needs loads where it is used
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


def kill_live_children() -> None:
    """SIGKILL the tree of every child started here that is still running."""
    for proc in list(_LIVE_CHILDREN):
        if proc.returncode is None or not proc.reap_keeper(0):
            kill_tree(proc.pid, tree_members(proc.pid, proc.adopted()))
