"""How the hook ends a script whose measurement is over: as the script would end, within a bound.

When its result is written, the measured script has nothing left to do for torchpace, but it holds what
its own code would remove on the way out: `TemporaryDirectory` folders (the Hugging Face Trainer example
makes one), files it opened in `with` blocks, `finally` blocks, `atexit` handlers, objects whose finalizers
clean up. Ending it with `os._exit` leaves all of that behind after every trial. `end_script` ends it the
way Python ends a program, by `SystemExit` in its main thread: every `finally` and `with` on the way out
runs, then the `atexit` handlers and the finalizers of what is still alive; then the process ends with
the hook's status, whatever those raised (`_finish`, the last exit handler), so the parent reads the hook's
result as the trial's. None of that may keep the trial waiting: `END_BOUND_S` after the end was asked for,
the process stops outright (`os._exit`), wherever the script is (a `finally` that hangs, a worker that does
not join, a script that catches `SystemExit` and trains on).

Where the end is decided in another thread (a watchdog), the main thread is told with a real-time signal
whose handler raises `SystemExit` (a signal also breaks a blocking call, a stalled read or a sleep),
installed when the hook is; where the script holds that signal itself, or torch was imported outside the
main thread, `SystemExit` is set on the main thread to raise at its next Python instruction.
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing.util
import os
import signal
import sys
import threading
import time
import weakref

END_BOUND_S = 10.0  # the script's own clean-up (finally, with, atexit, finalizers) gets this long, then it stops
_WAKE = signal.SIGRTMIN + 3  # tells the main thread to end; a real-time signal scripts leave alone
_requested: list[int] = []  # the status the hook ended the process with, once asked for
_wake_installed = False


def install() -> None:
    """Prepare the ending (called when the hook is installed, before its own exit handler is registered, so
    that `_finish` runs after every other exit handler)."""
    global _wake_installed
    atexit.register(_finish)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(_WAKE) == signal.SIG_DFL:
        signal.signal(_WAKE, _on_wake)
        _wake_installed = True


def end_script(status: int = 0) -> None:
    """End the script with exit `status`: its own clean-up runs (see the module docstring), then it stops.

    Called in the main thread, this raises `SystemExit`; from another thread, it asks the main thread to raise
    it and returns. A second call while the first ends the script stops it at once."""
    if _requested:
        _stop(_requested[0])
    _requested.append(status)
    threading.Thread(target=_stop_after, args=(status,), name="torchpace-end-bound", daemon=True).start()
    main = threading.main_thread()
    if threading.current_thread() is main:
        raise SystemExit(status)
    if _wake_installed:
        signal.pthread_kill(main.ident, _WAKE)
    else:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main.ident), ctypes.py_object(SystemExit))


def _on_wake(signum, frame) -> None:
    if _requested:
        raise SystemExit(_requested[0])


def _stop_after(status: int) -> None:
    time.sleep(END_BOUND_S)
    _stop(status)


def _finish() -> None:
    """The last exit handler: when the hook ended the script, the finalizers still due run (a
    `TemporaryDirectory` not left through `with` removes its folder), multiprocessing's own exit runs
    (its temporary folder, its helper processes), and the process ends with the hook's status."""
    if not _requested:
        return  # the script ended by itself: Python ends it as usual
    for clean_up in (weakref.finalize._exitfunc, multiprocessing.util._exit_function):
        try:
            clean_up()
        except Exception:  # the script's own clean-up failing changes nothing of the result already written
            continue
    _stop(_requested[0])


def _stop(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced by the script: nothing left to say
            continue
    os._exit(status)


__all__ = ["END_BOUND_S", "install", "end_script"]
