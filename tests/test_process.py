"""The process toolkit over real children: stubborn children, grandchildren in sessions of their own,
a parent killed outright, and a signal that arrives before the child exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _support import still_running
from torchpace.process import SignalForwarder, child_setup, exit_code, start_child, stop_tree

PY = sys.executable
_WAIT_S = 20.0  # generous: the host may be busy; every wait ends as soon as its condition holds

# Ignores SIGTERM (and so does the grandchild, which inherits that), starts a grandchild (in a session
# of its own when argv[2] == "session"), writes the grandchild's pid to argv[1], then sleeps or exits (argv[3]).
STUBBORN_WITH_GRANDCHILD = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                  start_new_session=sys.argv[2] == "session")
    open(sys.argv[1], "w").write(str(grandchild.pid))
    if sys.argv[3] == "stay":
        time.sleep(60)
""")


def _read_pid(path: Path) -> int:
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def _kill_quietly(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone, as it should be


def test_exit_code_follows_the_shell():
    assert [exit_code(c) for c in (0, 1, 3, -15, -9)] == [0, 1, 3, 143, 137]


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_with_its_grandchild(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    proc = start_child([PY, "-c", STUBBORN_WITH_GRANDCHILD, str(pid_file), "session", "stay"])
    grandchild = _read_pid(pid_file)
    try:
        found = stop_tree(proc, grace_s=0.5)
        assert proc.returncode == -signal.SIGKILL  # SIGTERM was ignored
        assert found == 1 and still_running([grandchild], _WAIT_S) == []  # in a session of its own: not in the group, still stopped
    finally:
        _kill_quietly(proc.pid, grandchild)


def test_what_an_exited_child_left_in_its_group_is_stopped(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    proc = start_child([PY, "-c", STUBBORN_WITH_GRANDCHILD, str(pid_file), "group", "exit"])
    grandchild = _read_pid(pid_file)
    try:
        assert proc.wait(timeout=_WAIT_S) == 0
        assert still_running([grandchild], timeout_s=0.2) == [grandchild]  # orphaned, no longer a descendant of anyone we know
        assert stop_tree(proc, grace_s=0.5) == 1 and still_running([grandchild], _WAIT_S) == []  # it ignores SIGTERM too (inherited)
        assert stop_tree(proc, grace_s=0.5) == 0  # nothing left: a no-op
    finally:
        _kill_quietly(grandchild)


PARENT = textwrap.dedent("""
    import signal, subprocess, sys, time
    from torchpace.process import start_child
    ready, how = sys.argv[1], sys.argv[2]
    child = "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    if how == "start_child":
        start_child([sys.executable, "-c", "import os, sys, time; " + child, ready], death_signal=signal.SIGTERM)
    else:  # the child asks for itself, as a torchrun rank does
        setup = "from torchpace.process import die_with_parent; die_with_parent(); "
        subprocess.Popen([sys.executable, "-c", "import os, sys, time; " + setup + child, ready])
    time.sleep(60)
""")


@pytest.mark.parametrize("how", ["start_child", "die_with_parent"])
def test_the_child_dies_when_its_parent_is_killed_outright(tmp_path, how):
    ready = tmp_path / "child.pid"
    parent = subprocess.Popen([PY, "-c", PARENT, str(ready), how])
    try:
        child = _read_pid(ready)  # written once the child's death signal is in place
        parent.kill()
        parent.wait(timeout=_WAIT_S)
        assert still_running([child], _WAIT_S) == [], "the child outlived its parent's SIGKILL"
    finally:
        parent.kill()
        parent.wait()
        if ready.exists():
            _kill_quietly(int(ready.read_text()))


def test_a_child_whose_parent_is_already_gone_ends_itself():
    not_the_parent = 1 if os.getpid() != 1 else 2  # what the child would find after a reparenting
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"],
                            preexec_fn=child_setup(signal.SIGKILL, parent_pid=not_the_parent))
    try:
        assert proc.wait(timeout=_WAIT_S) == -signal.SIGKILL
    finally:
        proc.kill()


def test_a_signal_that_arrives_before_the_child_exists_is_forwarded_once_it_does():
    forwarder = SignalForwarder(None, grace_s=60.0)
    with forwarder.installed():
        signal.raise_signal(signal.SIGTERM)  # handled here: nothing to send it to yet
        assert forwarder.received == ["SIGTERM"]
        proc = start_child([PY, "-c", "import time; time.sleep(60)"])
        try:
            forwarder.attach(proc.pid)
            assert forwarder.wait(proc, poll_s=0.1) == -signal.SIGTERM
        finally:
            proc.kill()
            proc.wait()
    assert forwarder.received == ["SIGTERM"] and not forwarder.killed
    assert signal.getsignal(signal.SIGTERM) is not forwarder.handle  # the handlers were put back


@pytest.mark.parametrize("second_signal", [True, False], ids=["second signal", "grace over"])
def test_the_tree_is_killed_after_a_second_signal_or_the_grace(tmp_path, second_signal):
    now = [0.0]
    pid_file = tmp_path / "grandchild.pid"
    proc = start_child([PY, "-c", STUBBORN_WITH_GRANDCHILD, str(pid_file), "session", "stay"])
    grandchild = _read_pid(pid_file)
    forwarder = SignalForwarder(proc.pid, grace_s=30.0, clock=lambda: now[0])
    try:
        forwarder.handle(signal.SIGTERM)  # ignored by the child
        forwarder.escalate_if_due()
        assert not forwarder.killed and proc.poll() is None
        if second_signal:
            forwarder.handle(signal.SIGTERM)
        else:
            now[0] = 31.0
        assert forwarder.wait(proc, poll_s=0.05) == -signal.SIGKILL
        assert forwarder.killed and forwarder.received[-1].startswith("SIGKILL (")
        assert still_running([grandchild], _WAIT_S) == []
    finally:
        _kill_quietly(proc.pid, grandchild)
        proc.wait()
