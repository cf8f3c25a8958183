"""The one stop-signal policy of every command: SIGINT, SIGTERM and SIGHUP raise in the main thread, so a
command unwinds through its `finally` blocks (its children's trees stopped, `temporary_folder`s removed)
and exits `stop_exit_code` (130, 143, 129).

`stop_signals_raise` is installed by `cli/_common.run_cli` for every command. A second stop signal
while the first unwinds kills the live children at once (`process.kill_live_children`); a watcher thread
on a wakeup fd does the clean-up itself and exits when the main thread is blocked in C code, interrupts
a blocking call that a stop came just before (a SIGURG poke, never a stop), and sends again a stop that
Python dropped (raised in an at-fork callback, a `__del__`: seen by the policy's `sys.unraisablehook`).
A process forked under the policy leaves the watcher's pipe alone.

The child processes themselves (starting, forwarding signals to, and stopping their trees) are
`torchpace.process`. This module imports only the standard library and `process` at load.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

from torchpace.process import kill_live_children



class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP received: unwinds as Ctrl-C does (every `finally` runs, so child trees are stopped
    and temporary folders removed); the command then exits 128 + `signum` (143 for SIGTERM).

    Attributes:
        signum: the signal received.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_STUCK_S = 5.0  # a stop signal the main thread has not handled after this long: it is blocked in C code
_POKE_S = 0.2  # a stop signal not handled after this long: the main thread is poked, to interrupt the call it came before
# The poke: ignored by default and used by nothing torchpace runs in its own process (Go's runtime preempts
# threads with it for that reason). Never a stop signal, so a poke that lands just after the handler ran
# cannot count as a second stop.
_POKE = signal.SIGURG
_TEMP_FOLDERS: set[str] = set()  # live temporary folders (`temporary_folder`), removed on an emergency stop


def stop_exit_code(stop: BaseException) -> int:
    """The exit status of a command ended by `stop`: 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + (stop.signum if isinstance(stop, Terminated) else signal.SIGINT)


def stop_reason(stop: BaseException) -> str:
    """`interrupted (Ctrl-C)` or `terminated (SIGTERM)`: how messages name the stop."""
    if isinstance(stop, Terminated):
        return f"terminated ({signal.Signals(stop.signum).name})"
    return "interrupted (Ctrl-C)"


@contextlib.contextmanager
def temporary_folder(prefix: str, dir: str | os.PathLike | None = None) -> Iterator[Path]:
    """A temporary folder (`tempfile.mkdtemp`) removed when the block ends, and by an emergency stop
    (`stop_signals_raise`) when the main thread cannot get there."""
    # lazy: every command loads this module at start-up; what else it needs loads where it is used
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    _TEMP_FOLDERS.add(path)
    try:
        yield Path(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _TEMP_FOLDERS.discard(path)


@contextlib.contextmanager
def stop_signals_raise(on_emergency: Callable[[str], None] | None = None) -> Iterator[None]:
    """The one signal policy of every command: SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP raise
    `Terminated`, in the main thread, so the command unwinds and cleans up (children's trees stopped,
    temporary folders removed) and exits 130, 143 or 129 (`stop_exit_code`).

    A second stop signal while the first unwinds does not interrupt the clean-up: every child tree
    started here is killed at once instead. And when the main thread is blocked in C code (a database
    lock, a long native call) and has not handled a stop signal `_STUCK_S` seconds later, a watcher
    thread does the clean-up itself (child trees killed, temporary folders removed), says so through
    `on_emergency`, and ends the process with the same exit status.

    No stop is lost where it lands. Python runs a signal's handler at the next bytecode of the main
    thread, wherever that is: inside an at-fork callback (logging's, as a DataLoader forks its workers),
    a `__del__`, a weakref or gc callback, where an exception is only printed as "Exception ignored"
    (`sys.unraisablehook`) and the code goes on. The stop raised there is recognised in that hook, not
    printed, and the watcher sends the same signal to the main thread again, so it raises once the main
    thread is back in ordinary code. A stop that came just as the main thread entered a blocking call
    (where Python runs the handler only when the call returns) is not left there: the watcher pokes the
    main thread with SIGURG every `_POKE_S`, which interrupts the call, and the stop's handler runs. The
    poke is not a stop signal, so one that lands after the handler ran changes nothing. A process forked
    under the policy (DataLoader workers, fork-started multiprocessing) leaves the watcher's pipe alone: a
    signal to that child is not one to this process.

    A signal this process was told to ignore (SIGHUP under nohup, SIGINT in a background job) stays
    ignored. Outside the main thread nothing is installed. A child started with its own forwarding
    (`SignalForwarder`, as `launch` and `monitor` do) replaces these handlers while it runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = _StopState(on_emergency or (lambda line: None))
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, state.handle)
    previous_poke = signal.getsignal(_POKE)
    if previous_poke == signal.SIG_DFL:  # a handler of Python's makes the poke interrupt a blocking call
        signal.signal(_POKE, _poked)
    watcher = state.start_watching()
    previous_hook, sys.unraisablehook = sys.unraisablehook, state.unraisable_hook(sys.unraisablehook)
    try:
        yield
    finally:
        state.closing = True  # from here a stop is kept, not raised, until the handlers are put back
        sys.unraisablehook = previous_hook
        watcher.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if previous_poke == signal.SIG_DFL:  # a poke still on its way is ignored, as by default
            signal.signal(_POKE, previous_poke)
    kept = state.kept + state.dropped  # a stop that came as the command ended: it ends as stopped
    if kept:
        raise KeyboardInterrupt() if kept[0] == signal.SIGINT else Terminated(kept[0])


def _poked(signum: int, frame: Any = None) -> None:
    """The poke's handler: its delivery interrupted the main thread's blocking call, so the pending stop's
    handler runs now; there is nothing else to do."""


class _StopState:
    """What `stop_signals_raise` knows: signals received and handled, for the handler and the watcher;
    and the stops Python dropped (raised where it ignores exceptions), for the watcher to send again."""

    def __init__(self, on_emergency: Callable[[str], None]):
        self.on_emergency = on_emergency
        self.handled = 0
        self.first: int | None = None
        self.dropped: list[int] = []
        self.watcher: _Watcher | None = None
        self.closing = False
        self.kept: list[int] = []
        self.in_hook = False

    def handle(self, signum: int, frame: Any = None) -> None:
        self.handled += 1
        if self.closing:  # the policy is being taken down: `stop_signals_raise` raises it once that is done
            self.kept.append(signum)
            return
        if self.in_hook:  # inside `unraisable_hook`, where a raise is dropped unseen: sent again with the rest
            self.dropped.append(signum)
            return
        if self.first is not None:  # unwinding already: end the children now, let the clean-up finish
            kill_live_children()
            return
        self.first = signum
        stop = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
        stop._torchpace_stop = self  # how `unraisable_hook` knows its own stop
        raise stop

    def unraisable_hook(self, previous: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """A `sys.unraisablehook` that takes back a stop Python dropped: the stop is not unwinding
        anything, so it is sent again (by the watcher, once the main thread has left the place that
        ignores exceptions); any other unraisable exception goes to `previous`. The watcher waits for
        the hook to return before it sends: a stop raised inside the hook would be lost unseen."""
        def hook(unraisable: Any) -> None:
            stop = unraisable.exc_value
            if getattr(stop, "_torchpace_stop", None) is not self or self.watcher is None \
                    or not self.watcher.ours():
                previous(unraisable)
                return
            self.in_hook = True
            self.first = None  # the next delivery raises again
            self.dropped.append(stop.signum if isinstance(stop, Terminated) else signal.SIGINT)
            self.watcher.wake()
            self.in_hook = False
        return hook

    def start_watching(self) -> _Watcher:
        self.watcher = _Watcher(self)
        return self.watcher


_WAKE = b"\0"  # not a signal number: written to the watcher's pipe to have it send the dropped stops again


class _Watcher:
    """Reads the signal numbers Python's C handler writes to a wakeup fd; if the main thread has not run
    its handler `_STUCK_S` after a stop signal, does the emergency stop. Sends a dropped stop again."""

    def __init__(self, state: _StopState):
        self.state = state
        self.pid = os.getpid()
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self.run, name="torchpace-stop-watcher", daemon=True)
        _WATCHERS.add(self)
        self.thread.start()

    def ours(self) -> bool:
        """Whether this process is the one watched (not a child forked from it, where no watcher runs)."""
        return os.getpid() == self.pid

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe: the watcher has bytes to read already
            os.write(self.write_fd, _WAKE)

    def forget_in_child(self) -> None:
        """In a child forked from the watched process: a signal to the child is the child's own, so its C
        handler must not write to the parent's pipe (the parent's watcher would take it for its own
        unhandled stop and end the parent)."""
        try:
            current = signal.set_wakeup_fd(self.previous_fd)
        except ValueError:  # not the main thread: the fd stays, and so must the pipe it names
            return
        if current != self.write_fd:  # the child's own code set one since: it stays
            signal.set_wakeup_fd(current)
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def run(self) -> None:
        received = 0
        while True:
            try:
                data = os.read(self.read_fd, 64)
            except OSError:
                return
            if not data:
                return
            if _WAKE[0] in data:
                self.send_dropped()
            # only signals our handler is in place for (a `SignalForwarder` handles its own while its child runs)
            stops = [signum for signum in data if signum in STOP_SIGNALS and signal.getsignal(signum) == self.state.handle]
            if not stops:
                continue
            received += len(stops)
            self.await_handler(received, stops[0])

    def await_handler(self, received: int, signum: int) -> None:
        """Wait for the main thread to have run the handler `received` times. A signal that came as the main
        thread entered a blocking call (Python runs the handler when the call returns, which may be never) is
        followed by a poke every `_POKE_S` to interrupt the call; one still not handled `_STUCK_S` later is an
        emergency."""
        start = time.monotonic()
        poke_at = start + _POKE_S
        while self.state.handled < received:
            now = time.monotonic()
            if now >= start + _STUCK_S:
                self.emergency(signum)
            if now >= poke_at:
                self.poke()
                poke_at = now + _POKE_S
            time.sleep(0.01)

    def poke(self) -> None:
        """Interrupt the main thread's blocking call, so that it runs the handler of a stop still pending.
        Harmless at any moment: the handler may have run since the caller looked, and the poke is no stop."""
        if signal.getsignal(_POKE) is _poked:  # not where SIGURG is someone else's, or ignored
            signal.pthread_kill(threading.main_thread().ident, _POKE)

    def emergency(self, signum: int) -> None:
        # lazy: every command loads this module at start-up; what else it needs loads where it is used
        import shutil

        stop = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
        self.state.on_emergency(f"{stop_reason(stop)}, while blocked for {_STUCK_S:g} s: children and temporary "
                                "folders were removed without the usual clean-up")
        kill_live_children()
        for folder in list(_TEMP_FOLDERS):
            shutil.rmtree(folder, ignore_errors=True)
        os._exit(stop_exit_code(stop))

    def send_dropped(self) -> None:
        """Send each dropped stop to the main thread again. Should another stop be unwinding by now, this
        one counts as its second signal (children killed at once), as the two signals received do."""
        while self.state.in_hook:
            time.sleep(0.001)
        while self.state.dropped:
            signal.pthread_kill(threading.main_thread().ident, self.state.dropped.pop(0))

    def stop(self) -> None:
        _WATCHERS.discard(self)
        if not self.ours():  # a forked child leaving the policy: its copies of the pipe are closed already
            return
        signal.set_wakeup_fd(self.previous_fd)
        os.close(self.write_fd)
        self.thread.join(timeout=5)
        os.close(self.read_fd)


_WATCHERS: weakref.WeakSet[_Watcher] = weakref.WeakSet()  # the watchers running in this process


def _forget_watchers_in_child() -> None:
    for watcher in list(_WATCHERS):
        if not watcher.ours():
            _WATCHERS.discard(watcher)  # once: the pipe's fd numbers may be the child's own files later
            watcher.forget_in_child()


os.register_at_fork(after_in_child=_forget_watchers_in_child)
