"""One stop-signal policy for every verb: SIGINT and SIGTERM end the whole tree, remove the temporary
folders and exit 130/143; a SIGKILL'd torchpace leaves nothing running, grandchildren in sessions of
their own included (each child runs under a keeper, `torchpace.process.start_child`); and a main thread
blocked in C code cannot hold a stop signal back. Real processes throughout; each moment is arranged
(a file the script writes once it runs, a line the child prints), never timed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from _support import fixture_workload, sigint_as_at_a_terminal, still_running, temp_leftovers

PY = sys.executable
SCRIPTS = Path(__file__).parent / "script" / "scripts"
_WAIT_S = 120.0  # generous: the host may be busy; every wait ends as soon as its condition holds


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout_s: float = _WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {path.name} appeared: {proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _kill_quietly(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def tmp(short_tmpdir):
    """The children's TMPDIR: what they leave there is what a user's temp folder would keep."""
    return short_tmpdir


def _start(argv, tmp_path, tmp, **kw) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp), **kw.pop("env", {}))
    return subprocess.Popen([PY, "-m", "torchpace", *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


# ---- a script's tree: SIGTERM and SIGINT to the verb running it ------------------------------------------

_SCRIPT_VERBS = {"bench": ["bench", "--max-time", "600"], "profile": ["profile", "--steps", "100"],
                 "launch": ["launch"], "compare": ["compare", "--set", "threads.intra_op=1", "--max-time", "600"],
                 "tune": ["tune", "--budget", "30m", "--knob", "threads.intra_op"]}
# every verb that runs a script under SIGTERM and Ctrl-C; the two that run it in trial processes (compare: two
# at once, tune: one per trial) under SIGTERM, which takes the same path
_STOPS = [(verb, stop) for verb in ("bench", "launch", "profile") for stop in (signal.SIGTERM, signal.SIGINT)] + [
    ("compare", signal.SIGTERM), ("tune", signal.SIGTERM)]


@pytest.mark.parametrize(("verb", "stop"), _STOPS, ids=[f"{v}-{signal.Signals(s).name}" for v, s in _STOPS])
def test_a_stop_signal_ends_the_scripts_whole_tree_and_its_folders(verb, stop, tmp_path, tmp):
    pids_file = tmp_path / "pids.json"
    argv = [*_SCRIPT_VERBS[verb], "--", "python", str(SCRIPTS / "spawns_and_trains.py"), str(pids_file)]
    proc = _start(argv, tmp_path, tmp, preexec_fn=sigint_as_at_a_terminal)
    pids: dict = {}
    try:
        _wait_for_file(pids_file, proc)  # the script runs, has its two processes, and steps
        pids = json.loads(pids_file.read_text())
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=_WAIT_S)
        assert proc.returncode == 128 + stop, err[-3000:]
        assert still_running(pids.values()) == [], f"left running: {pids}"
        assert temp_leftovers(tmp) == []
    finally:
        proc.kill()
        _kill_quietly(pids.values())


@pytest.mark.parametrize("verb", ["bench", "launch"])
def test_a_sigkilled_torchpace_leaves_nothing_running(verb, tmp_path, tmp):
    pids_file = tmp_path / "pids.json"
    argv = [*_SCRIPT_VERBS[verb], "--", "python", str(SCRIPTS / "spawns_and_trains.py"), str(pids_file)]
    proc = _start(argv, tmp_path, tmp)
    pids: dict = {}
    try:
        _wait_for_file(pids_file, proc)
        pids = json.loads(pids_file.read_text())
        proc.kill()
        proc.communicate(timeout=_WAIT_S)
        # the keeper gave the tree its death signal, then SIGKILL 3 s later: the daemon in its own session too
        assert still_running(pids.values()) == [], f"outlived a SIGKILL'd torchpace: {pids}"
    finally:
        proc.kill()
        _kill_quietly(pids.values())


def test_what_a_script_started_is_ended_after_a_successful_bench(tmp_path, tmp):
    pids_file = tmp_path / "pids.json"
    proc = _start(["bench", "--max-time", "2", "--", "python", str(SCRIPTS / "spawns_and_trains.py"), str(pids_file),
                   "200000"], tmp_path, tmp)
    out, err = proc.communicate(timeout=600)
    pids = json.loads(pids_file.read_text())
    try:
        assert proc.returncode == 0, err[-3000:]
        assert still_running(pids.values(), timeout_s=0) == [], f"left running after the bench: {pids}"
    finally:
        _kill_quietly(pids.values())


def test_sigterm_ends_a_workload_bench_in_this_process_with_143(tmp_path, tmp):
    marker = tmp_path / "training"
    proc = _start(["bench", fixture_workload("marks_when_it_trains"), "--max-time", "600", "--set", "data.num_workers=1"],
                  tmp_path, tmp, env={"TORCHPACE_TEST_MARKER": str(marker)})
    try:
        _wait_for_file(marker, proc)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=_WAIT_S)
        assert proc.returncode == 143 and "terminated (SIGTERM)" in err, err[-3000:]
        assert still_running([c.pid for c in children]) == []
    finally:
        proc.kill()


# ---- tune waiting for a locked study ---------------------------------------------------------------------


def test_sigterm_while_tune_waits_for_a_locked_study_exits_143_at_once(tmp_path, tmp):
    from torchpace.tune.storage import open_storage

    db = tmp_path / "s.db"
    open_storage(f"sqlite:///{db}").engine.dispose()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    proc = _start(["tune", fixture_workload("tiny_mlp"), "--storage", f"sqlite:///{db}?timeout=600", "--out",
                   str(tmp_path / "t.toml")], tmp_path, tmp)
    try:
        for line in proc.stderr:  # the notice comes when the wait begins
            if "is locked by another process: waiting" in line:
                break
        else:
            raise AssertionError(f"no waiting notice; exit {proc.wait()}")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # the lock is held for 600 s: only the signal can end the wait this soon
        assert proc.returncode == 143
        assert not (tmp_path / "t.toml").exists() and temp_leftovers(tmp) == []
    finally:
        proc.kill()
        holder.execute("ROLLBACK")
        holder.close()


# ---- the process toolkit: a main thread blocked in C, and the keeper -------------------------------------

BLOCKED_IN_C = textwrap.dedent("""
    import ctypes, sys
    from torchpace.process import start_child
    from torchpace.stop_policy import stop_exit_code, stop_signals_raise, temporary_folder
    with stop_signals_raise(lambda line: print(line, file=sys.stderr, flush=True)):
        with temporary_folder("torchpace-test-", sys.argv[1]) as folder:
            child = start_child([sys.executable, "-c", "import time; time.sleep(600)"])
            print(folder, child.child_pid, flush=True)
            # the main thread in C for 60 s: glibc's system() waits for its shell whatever signals come
            ctypes.CDLL(None).system(b"echo blocked >&2; sleep 60")
""")


def test_a_main_thread_blocked_in_c_cannot_hold_a_stop_signal_back(tmp_path):
    proc = subprocess.Popen([PY, "-c", BLOCKED_IN_C, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    shell = []
    try:
        folder, child = proc.stdout.readline().split()
        assert proc.stderr.readline().strip() == "blocked"  # printed by the shell: the main thread is in system()
        shell = [p for p in psutil.Process(proc.pid).children() if "sleep 60" in " ".join(p.cmdline())]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 143  # the watcher acts 5 s after the signal; the shell sleeps 60 s
        assert not Path(folder).exists() and still_running([int(child)]) == []
    finally:
        proc.kill()
        for leftover in shell:  # system()'s shell is not torchpace's child: the test ends it
            with contextlib.suppress(psutil.Error):
                for process in [*leftover.children(recursive=True), leftover]:
                    process.kill()
    assert "while blocked" in proc.stderr.read()


# Python runs a signal's handler at the main thread's next bytecode, wherever that is; in an at-fork
# callback (logging's, as a DataLoader forks a worker), a __del__, a weakref or gc callback, the stop it
# raises is only printed as "Exception ignored" and the code goes on. Each place is reached here for sure:
# `signal.raise_signal` runs the handler before it returns, inside the callback.
DROPPED_STOP = textwrap.dedent("""
    import gc, os, signal, sys, weakref
    from torchpace.stop_policy import stop_exit_code, stop_signals_raise

    def stop_here():
        signal.raise_signal(signal.SIGTERM)

    class Dropper:
        def __del__(self):
            stop_here()

    class Target:
        pass

    def once_from_gc(phase, info):
        gc.callbacks.remove(once_from_gc)
        stop_here()

    try:
        with stop_signals_raise():
            where = sys.argv[1]
            if where == "at-fork":
                os.register_at_fork(after_in_parent=stop_here)
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
            elif where == "__del__":
                Dropper()
            elif where == "weakref":
                target = Target()
                ref = weakref.ref(target, lambda r: stop_here())
                del target
            elif where == "gc":
                gc.callbacks.append(once_from_gc)
                gc.collect()
            sys.stdin.readline()  # the test writes nothing and keeps stdin open: only the stop ends this
    except KeyboardInterrupt as stop:
        sys.exit(stop_exit_code(stop))
""")


@pytest.mark.parametrize("where", ["at-fork", "__del__", "weakref", "gc"])
def test_a_stop_raised_where_python_ignores_exceptions_is_not_lost(where):
    proc = subprocess.Popen([PY, "-c", DROPPED_STOP, where], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc.wait(timeout=_WAIT_S)  # stdin stays open: lost, the stop would leave it reading for ever
        err = proc.stderr.read()
        assert proc.returncode == 143, err[-3000:]
        assert "Exception ignored" not in err  # taken back and acted on, not printed as dropped
    finally:
        proc.kill()
        proc.stdin.close()


# A child forked under the policy (a DataLoader worker, fork-started multiprocessing) is sent SIGTERM by its
# own parent (DataLoader ends a worker that does not stop so). With `_STUCK_S` 0 the watcher ends the process
# at once for any stop it reads and the handler has not run: leaving the policy closes the pipe, and the
# watcher reads all that was written to it before it sees the end.
FORKED_CHILDS_STOP = textwrap.dedent("""
    import os, signal, sys
    import torchpace.stop_policy
    from torchpace.stop_policy import stop_signals_raise
    torchpace.stop_policy._STUCK_S = 0.0
    with stop_signals_raise():
        pid = os.fork()
        if pid == 0:
            try:
                signal.raise_signal(signal.SIGTERM)  # the child's own stop
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    print("ran on", flush=True)
""")


def test_a_stop_signal_to_a_forked_child_is_not_taken_for_the_parents():
    proc = subprocess.run([PY, "-c", FORKED_CHILDS_STOP], capture_output=True, text=True, timeout=_WAIT_S)
    assert (proc.returncode, proc.stdout) == (0, "ran on\n"), proc.stderr[-3000:]


# A stop whose handler Python has not run while the main thread sits in a blocking call: the main thread
# blocks SIGTERM, so the process's SIGTERM is taken by the watcher thread, and the main thread's read is never
# interrupted by it (as when the signal came just before the call began). The watcher's poke interrupts the
# read, the pending stop's handler runs, and the command ends as stopped, before the emergency at 5 s.
STOP_BEFORE_A_BLOCKING_CALL = textwrap.dedent("""
    import signal, sys
    from torchpace.stop_policy import stop_exit_code, stop_signals_raise
    try:
        with stop_signals_raise(lambda line: print(line, file=sys.stderr, flush=True)):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # this thread only: the watcher takes it
            print("reading", flush=True)
            sys.stdin.readline()  # the test writes nothing and keeps stdin open: only the stop ends this
    except BaseException as stop:
        sys.exit(stop_exit_code(stop))
""")


def test_a_stop_that_came_before_a_blocking_call_is_handled_without_the_emergency():
    proc = subprocess.Popen([PY, "-c", STOP_BEFORE_A_BLOCKING_CALL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "reading\n"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=_WAIT_S)
        err = proc.stderr.read()
        assert proc.returncode == 143, err[-3000:]
        assert "while blocked" not in err  # the handler ran: not the watcher's emergency stop
    finally:
        proc.kill()
        proc.stdin.close()


# The watcher pokes the main thread when it looks and sees a stop not yet handled; the main thread may run
# the handler between that look and the poke. The poke then lands while the first stop unwinds, and must not
# count as the second stop (which kills every child at once instead of stopping it in order).
LATE_POKE = textwrap.dedent("""
    import signal, sys, time
    import torchpace.stop_policy as policy
    from torchpace.process import start_child, stop_tree
    from torchpace.stop_policy import stop_signals_raise
    with stop_signals_raise():
        child = start_child([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            try:
                signal.raise_signal(signal.SIGTERM)  # the first stop, handled at once
            except policy.Terminated:
                (watcher,) = policy._WATCHERS
                watcher.poke()  # as if the watcher had looked just before the handler ran
                time.sleep(0.5)  # the poke is delivered to this thread, and its handler runs, in here
                print("child running" if child.poll() is None else f"child ended: {child.returncode}", flush=True)
        finally:
            stop_tree(child, 5.0)
""")


def test_a_poke_that_lands_after_the_handler_ran_is_not_a_second_stop():
    proc = subprocess.run([PY, "-c", LATE_POKE], capture_output=True, text=True, timeout=_WAIT_S)
    assert (proc.returncode, proc.stdout) == (0, "child running\n"), proc.stderr[-3000:]


def test_a_keeper_reports_the_childs_exit_and_ends_what_it_left_when_stopped(tmp_path):
    from torchpace.process import start_child, stop_tree

    script = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], " \
             "start_new_session=True); print(flush=True); sys.exit(3)"
    proc = start_child([PY, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.wait(timeout=_WAIT_S) == 3  # the child's status, though the daemon it left still runs
        left = [p for p in proc.adopted() if p.status() != psutil.STATUS_ZOMBIE]
        assert len(left) == 1  # adopted by the keeper: still in the tree, though in a session of its own
        assert stop_tree(proc, grace_s=1.0) == 1 and still_running([left[0].pid]) == []
        assert still_running([proc.keeper_pid]) == []  # and the keeper collected
    finally:
        proc.kill()
        for leftover in proc.adopted():
            leftover.kill()


def test_a_kept_childs_pid_is_its_own_leading_a_session_the_keeper_stays_out_of():
    from torchpace.process import start_child

    script = "import os; print(os.getpid(), os.getpgid(0), os.getsid(0), flush=True); input()"
    proc = start_child([PY, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid, pgid, sid = map(int, proc.stdout.readline().split())
        assert pid == pgid == sid == proc.pid  # as Popen shows a child: signals to its group are the child's
        assert psutil.Process(proc.pid).ppid() == proc.keeper_pid != proc.pid
        assert os.getpgid(proc.keeper_pid) != proc.pid and os.getsid(proc.keeper_pid) != proc.pid
        proc.send_signal(signal.SIGSTOP)  # a group stopped for its turn (paired trials) leaves the keeper running
        assert psutil.Process(proc.keeper_pid).status() != psutil.STATUS_STOPPED
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=_WAIT_S) == 0 and proc.returncode == 0
        assert proc.reap_keeper(_WAIT_S)
    finally:
        proc.kill()


def test_a_command_that_cannot_start_raises_as_popen_does():
    from torchpace.process import start_child

    with pytest.raises(FileNotFoundError):
        start_child(["/no/such/program-torchpace"])
