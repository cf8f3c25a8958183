"""A throw-away PostgreSQL server for the tests and `make bench-fleet` (Debian's binaries, a real server).

`ThrowawayPostgres.start()` runs `initdb` into a fresh temp dir and `pg_ctl start` on a unix-socket
directory inside it and a free loopback port; `stop()` stops it and removes the dir. As root the server
runs as the unprivileged `postgres` user (PostgreSQL refuses to run as root), with the dir chowned to it.
TCP connections need the superuser's password (scram-sha-256), so a wrong password is really refused.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

BIN_GLOB = "/usr/lib/postgresql/*/bin"
SERVER_PACKAGE = "postgresql"  # Debian's metapackage: the current major version's server binaries
USER = "postgres"
PASSWORD = "tp-secret"
_START_TIMEOUT_S = 60


def find_bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin dir (with initdb and pg_ctl), or None."""
    found = [Path(d) for d in glob.glob(BIN_GLOB) if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists()]
    return max(found, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0) if found else None


def install_server() -> str | None:
    """Install Debian's PostgreSQL server with apt-get when missing and root; None, or why it is absent."""
    from _support import apt_install

    return apt_install((SERVER_PACKAGE,), lambda: find_bin_dir() is not None)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ThrowawayPostgres:
    """One PostgreSQL cluster in a temp dir, listening on 127.0.0.1:`port` and a socket dir inside it."""

    bin_dir: Path
    root: Path
    port: int

    @classmethod
    def start(cls) -> "ThrowawayPostgres":
        """initdb + pg_ctl start; the caller must `stop()` it."""
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError(f"no PostgreSQL binaries in {BIN_GLOB}")
        server = cls(bin_dir, Path(tempfile.mkdtemp(prefix="tp-pg-")), free_port())
        try:
            server._init_and_start()
        except BaseException:
            server.stop()
            raise
        return server

    def _init_and_start(self) -> None:
        (self.root / "sock").mkdir()
        (self.root / "pwfile").write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER)
            for path in (self.root, self.root / "sock", self.root / "pwfile"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.root / "data"), "-U", USER, f"--pwfile={self.root / 'pwfile'}",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8")
        options = f"-k {self.root / 'sock'} -p {self.port} -h 127.0.0.1 -c fsync=off -c max_connections=60"
        self._run("pg_ctl", "-D", str(self.root / "data"), "-o", options, "-l", str(self.root / "server.log"),
                  "-w", "-t", str(_START_TIMEOUT_S), "start")

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", USER, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_START_TIMEOUT_S + 30, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
        return done

    def url(self, database: str = "postgres", password: str = PASSWORD, driver: str = "postgresql+psycopg") -> str:
        """A TCP URL of `database` on this server."""
        return f"{driver}://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` (over the socket dir); returns its URL."""
        self._run("createdb", "-h", str(self.root / "sock"), "-p", str(self.port), "-U", USER, name)
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its dir."""
        if (self.root / "data" / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


# ---- a fleet of tuner processes on one study (tests/tune/test_fleet.py, benchmarks/bench_fleet.py) -------


def study_exists(url: str, name: str) -> bool:
    """Whether study `name` is in the storage yet (read without creating Optuna's tables under the tuners)."""
    import sqlalchemy

    from torchpace.tune.storage import resolve_storage_url

    engine = sqlalchemy.create_engine(resolve_storage_url(url))
    try:
        with engine.connect() as conn:
            if "studies" not in sqlalchemy.inspect(conn).get_table_names():
                return False
            found = conn.execute(sqlalchemy.text("SELECT 1 FROM studies WHERE study_name = :n"), {"n": name}).first()
            return found is not None
    finally:
        engine.dispose()


def start_fleet(tune_cmd, url: str, study: str, count: int, cwd: Path, wait_s: float = 120) -> list[subprocess.Popen]:
    """`count` tuner processes on one study: the first creates it, the others join with --resume once it exists.

    Args:
        tune_cmd: (index, *extra args) -> the argv of tuner `index`.
    """
    import time

    first = subprocess.Popen(tune_cmd(0), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + wait_s
    while not study_exists(url, study) and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.3)
    if not study_exists(url, study):
        first.kill()
        raise RuntimeError(f"the first tuner never created the study: {first.communicate()[1][-2000:]}")
    others = [subprocess.Popen(tune_cmd(i, "--resume"), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for i in range(1, count)]
    return [first, *others]
