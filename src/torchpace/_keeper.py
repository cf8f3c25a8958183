"""The keeper: the small process between torchpace and each child it starts (`torchpace.process.start_child`).

Run as `python -I -S _keeper.py` (no site, no environment: only the standard library, nothing of the
user's path can shadow it), with what to start in `TORCHPACE_KEEPER_SPEC` (JSON, taken out of the
environment the child gets). It

1. makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`): every process of the tree whose parent
   dies (a DataLoader worker left behind, a process in a session of its own, a daemon) is adopted by
   the keeper instead of init, so the whole tree stays findable below it;
2. starts the child in a session of its own (it leads its process group; the keeper stays outside it,
   so signals to the child's group and a group stopped with SIGSTOP leave the keeper alone), with the
   child's parent-death signal asked for before exec, and tells torchpace on the status pipe `started
   PID` (or `failed ERRNO` when exec failed);
3. reaps every process that ends below it; when the child ends it writes `exited STATUS` (the raw wait
   status), then stays while anything else of the tree runs (torchpace's `stop_tree` ends it), and exits;
4. when torchpace dies (even by SIGKILL: the keeper's parent-death signal, SIGTERM, with the parent
   pid changed), sends the child's death signal to every process of the tree, SIGKILL to what is left
   `grace_s` later, and exits. So a killed torchpace leaves nothing running, grandchildren included.

A signal the keeper itself receives while torchpace lives is ignored (its handlers are reset to the
defaults in the child by exec). A signal torchpace itself was told to ignore (SIGINT under `nohup`/`&`)
stays ignored in the child.
"""

import ctypes
import json
import os
import signal
import sys
import time

SPEC_ENV = "TORCHPACE_KEEPER_SPEC"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# signals the keeper notices (its own parent-death signal) or lets pass to the group without dying of them
_NOTICED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE", "SIGXCPU",
            "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGTTIN", "SIGTTOU", "SIGTSTP")
_PYTHON_IGNORES = ("SIGPIPE", "SIGXFSZ")  # ignored by the interpreter itself: the child gets the defaults back
_SWEEP_S = 0.5  # after the grace, what is left is killed again this often until nothing is


class Keeper:
    def __init__(self, spec: dict):
        self.argv = spec["argv"]
        self.death_signal = spec["death_signal"] or signal.SIGKILL
        self.grace_s = float(spec["grace_s"])
        self.parent = int(spec["parent"])
        self.status_fd = int(spec["status_fd"])
        self.pid = os.getpid()
        self.child = None
        self.orphaned_at = None
        self.libc = ctypes.CDLL(None, use_errno=True)

    # ---- signals -------------------------------------------------------------------------------------
    def install_handlers(self) -> None:
        for name in _NOTICED:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            if signal.getsignal(signum) is signal.SIG_IGN and name not in _PYTHON_IGNORES:
                continue  # torchpace ignores it: so do the keeper and the child
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum, frame) -> None:
        if os.getpid() != self.pid:  # in the forked child before exec: not the keeper's business
            return
        if self.orphaned_at is None:
            if os.getppid() == self.parent:  # a signal for the group: the child's, not the keeper's
                return
            self.orphaned_at = time.monotonic()  # torchpace is gone: end the tree
            self.signal_tree(self.death_signal)
            signal.setitimer(signal.ITIMER_REAL, self.grace_s)
        elif signum == signal.SIGALRM:  # the grace is over: kill what is left, and again while anything is
            self.signal_tree(signal.SIGKILL)
            signal.setitimer(signal.ITIMER_REAL, _SWEEP_S)

    # ---- the tree ------------------------------------------------------------------------------------
    def descendants(self) -> list[int]:
        """Live processes below the keeper (zombies are not counted: they have exited)."""
        parents, live = {}, set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            pid = int(entry)
            parents[pid] = int(fields[1])
            if fields[0] != b"Z":
                live.add(pid)
        found, frontier = [], [self.pid]
        while frontier:
            below = [pid for pid, ppid in parents.items() if ppid in frontier and pid != self.pid]
            found.extend(below)
            frontier = below
        return [pid for pid in found if pid in live]

    def signal_tree(self, signum: int) -> None:
        for pid in self.descendants():
            try:
                os.kill(pid, signum)
            except OSError:
                pass  # it ended meanwhile

    def reap_until_none_left(self) -> None:
        """Reap everything that ends below (orphans come to the keeper); return when nothing is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0)  # retried after a signal handler ran (PEP 475)
            except ChildProcessError:
                return
            if pid == self.child:
                self.say(f"exited {status}")
                self.child = None

    # ---- talking to torchpace ------------------------------------------------------------------------
    def say(self, line: str) -> None:
        try:
            os.write(self.status_fd, f"{line}\n".encode())
        except OSError:
            pass  # torchpace is gone: nobody to tell

    # ---- the run -------------------------------------------------------------------------------------
    def start_child(self) -> bool:
        env = dict(os.environ)
        read_end, write_end = os.pipe()  # exec failure reports; both ends close on exec
        pid = os.fork()
        if pid == 0:  # the child: a session of its own (it leads its group; the keeper stays out), defaults back,
            try:        # its death signal, then exec
                os.close(read_end)
                os.setsid()
                for name in _PYTHON_IGNORES:
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
                self.libc.prctl(_PR_SET_PDEATHSIG, self.death_signal, 0, 0, 0)
                if os.getppid() != self.pid:
                    os.kill(os.getpid(), self.death_signal)
                os.execvpe(self.argv[0], self.argv, env)
            except OSError as err:
                os.write(write_end, str(err.errno or 0).encode())
            finally:
                os._exit(127)
        os.close(write_end)
        failure = b""
        while chunk := os.read(read_end, 64):
            failure += chunk
        os.close(read_end)
        if failure:
            os.waitpid(pid, 0)
            self.say(f"failed {failure.decode()}")
            return False
        self.child = pid
        self.say(f"started {pid}")
        return True

    def run(self) -> int:
        self.libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.install_handlers()
        if os.getppid() != self.parent:  # torchpace died while the keeper started
            return 0
        os.set_inheritable(self.status_fd, False)
        if not self.start_child():
            return 0
        if self.orphaned_at is not None:  # torchpace died while the child started
            self.signal_tree(self.death_signal)
        devnull = os.open(os.devnull, os.O_RDWR)  # the child holds the streams now: pipes end when it does
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        # and every other descriptor handed down for the child (pass_fds): a pipe's end closes with the child's
        os.closerange(3, self.status_fd)
        os.closerange(self.status_fd + 1, os.sysconf("SC_OPEN_MAX"))
        self.reap_until_none_left()
        return 0


def main() -> int:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    return Keeper(spec).run()


if __name__ == "__main__":
    sys.exit(main())
