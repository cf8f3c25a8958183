"""A throw-away two-node SLURM cluster on this host, for the tests (Debian's `slurm-wlm` and `munge`, real daemons).

`ThrowawaySlurm.start()` writes a munge key and a `slurm.conf` into a fresh temp dir, starts `munged` (as the
`munge` user, on a socket in that dir), `slurmctld`, and one `slurmd -N n1` / `-N n2` per node: both nodes are
this host (`NodeHostname` = its name, `NodeAddr=127.0.0.1`, a port each), so `srun -N2` runs one task on each with
SLURM_NODEID 0 and 1. `stop()` ends the daemons and removes the dir. Root only (slurmd runs as root); elsewhere
`skip_reason()` says why.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
_START_TIMEOUT_S = 60


def install() -> str | None:
    """Install SLURM and munge with apt-get when missing and root; None, or why they are absent."""
    from _support import apt_install

    if os.geteuid() != 0:
        return "the throw-away SLURM cluster needs root (slurmd runs as root)"
    return apt_install(PACKAGES, lambda: all(shutil.which(t) for t in ("slurmctld", "slurmd", "srun", "munged")))


def _free_ports(n: int) -> list[int]:
    """`n` consecutive free TCP ports on 127.0.0.1 (slurmd's Port=A-B range)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + n <= 65535 and all(_is_free(port) for port in range(base, base + n)):
            return list(range(base, base + n))
    raise RuntimeError("no free port range for slurmd")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class ThrowawaySlurm:
    """A SLURM cluster of two nodes (n1, n2) on this host, in `root`; `env` points its clients at it."""

    root: Path
    env: dict
    procs: list = field(default_factory=list)

    @classmethod
    def start(cls) -> "ThrowawaySlurm":
        root = Path(tempfile.mkdtemp(prefix="torchpace-slurm-"))
        os.chmod(root, 0o755)
        cluster = cls(root, {})
        try:
            cluster._start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start(self) -> None:
        root, host = self.root, socket.gethostname()
        munge = pwd.getpwnam("munge")
        munge_dir = root / "munge"
        munge_dir.mkdir()
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        for path in (munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        os.chmod(munge_dir, 0o700)
        os.chmod(key, 0o400)
        socket_path = munge_dir / "munge.socket"
        self._run(["runuser", "-u", "munge", "--", "munged", "--key-file", str(key), "--socket", str(socket_path),
                   "--pid-file", str(munge_dir / "munged.pid"), "--log-file", str(munge_dir / "munged.log"),
                   "--seed-file", str(munge_dir / "munged.seed"), "--force"])
        ctld_port, node_ports = _free_ports(1)[0], _free_ports(2)
        for sub in ("spool", "log", "run"):
            (root / sub).mkdir()
        conf = root / "slurm.conf"
        conf.write_text("\n".join([
            "ClusterName=torchpace", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={node_ports[0]}", "AuthType=auth/munge", f"AuthInfo=socket={socket_path}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2",
            "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={root}/spool/ctld",
            f"SlurmdSpoolDir={root}/spool/%n", f"SlurmctldPidFile={root}/run/slurmctld.pid",
            f"SlurmdPidFile={root}/run/slurmd-%n.pid", f"SlurmctldLogFile={root}/log/slurmctld.log",
            f"SlurmdLogFile={root}/log/slurmd-%n.log", "SlurmctldDebug=info", "SlurmdDebug=info",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            f"NodeName=n[1-2] NodeHostname={host} NodeAddr=127.0.0.1 Port={node_ports[0]}-{node_ports[1]} CPUs=1 "
            "State=UNKNOWN",
            "PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES", ""]))
        self.env = {"SLURM_CONF": str(conf)}
        env = {**os.environ, **self.env}
        self.procs.append(subprocess.Popen(["slurmctld", "-D", "-i"], env=env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))
        for node in ("n1", "n2"):
            self.procs.append(subprocess.Popen(["slurmd", "-D", "-N", node], env=env, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True)
            states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
            if states.get("n1") == "idle" and states.get("n2") == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM nodes did not come up within {_START_TIMEOUT_S} s: {self.logs()}")

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr.strip()}")

    def logs(self) -> str:
        return "\n".join(f"{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in sorted((self.root / "log").glob("*.log")))

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        pid_file = self.root / "munge" / "munged.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except (ValueError, ProcessLookupError):
                pass
        shutil.rmtree(self.root, ignore_errors=True)
