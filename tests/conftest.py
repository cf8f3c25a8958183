"""Shared test fixtures. Hygiene: a test that leaks environment variables or threads fails."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from _support import DECIDED_ENV, apt_install


# Set by pytest itself, or by torch's lazily imported modules (inductor writes its cache dir into
# os.environ on first import); not torchpace's doing.
_ENV_SET_BY_OTHERS = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_", "_TORCHINDUCTOR_", "TRITON_")


@pytest.fixture(autouse=True)
def _no_env_or_thread_leaks(request):
    env_before = dict(os.environ)
    threads_before = {t.ident for t in threading.enumerate()}
    yield
    env_after = dict(os.environ)
    changed = {k for k in env_before.keys() | env_after.keys()
               if env_before.get(k) != env_after.get(k) and not k.startswith(_ENV_SET_BY_OTHERS)}
    for key in changed:  # put the environment back so one leak does not fail every later test
        if key in env_before:
            os.environ[key] = env_before[key]
        else:
            os.environ.pop(key, None)
    assert not changed, f"test changed os.environ: {sorted(changed)}"
    leaked = [
        t for t in threading.enumerate()
        if t.ident not in threads_before and t.is_alive() and not t.daemon and t is not threading.current_thread()
    ]
    if request.node.get_closest_marker("torch_keeps_threads") is None:
        assert not leaked, f"test leaked threads: {[t.name for t in leaked]}"



class _FormatEveryRecord(logging.Handler):
    """Formats each torchpace log record as it is made, so a message whose arguments do not fit it fails
    the test that logged it (a handler that writes would only print "--- Logging error ---")."""

    def emit(self, record: logging.LogRecord) -> None:
        record.getMessage()


@pytest.fixture(autouse=True, scope="session")
def _every_log_record_formats():
    """Every torchpace record is made and formatted during the tests, DEBUG included (the `-v` log)."""
    logger = logging.getLogger("torchpace")
    handler = _FormatEveryRecord()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield
    logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment to launch from: ours without the variables the launcher decides on."""
    return {k: v for k, v in os.environ.items() if k not in DECIDED_ENV}


@pytest.fixture(scope="session")
def host():
    """This machine's HostFacts, probed once."""
    from torchpace.host import probe_host

    return probe_host()


@pytest.fixture
def cli_run(tmp_path):
    """Run `python -m torchpace ARGS` in a real subprocess; returns CompletedProcess (text)."""
    import subprocess
    import sys

    def run(*args, env_extra=None, cwd=None, timeout=300):
        env = dict(os.environ, XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(tmp_path / "cache")))
        env.update(env_extra or {})
        return subprocess.run([sys.executable, "-m", "torchpace", *args], capture_output=True, text=True,
                              env=env, cwd=cwd or tmp_path, timeout=timeout)

    return run


# ---- system packages the allocator / NUMA tests need ------------------------------------------------
_APT_PACKAGES = ("libjemalloc2", "libtcmalloc-minimal4", "numactl")


def _tools_present() -> bool:
    from torchpace.host import probe_host

    host = probe_host(with_gpus=False)
    return all(host.allocator_library(name) for name in ("jemalloc", "tcmalloc")) and host.numactl is not None


@pytest.fixture(scope="session")
def system_packages() -> None:
    """jemalloc, tcmalloc-minimal and numactl installed, or the test skipped with the reason."""
    missing = apt_install(_APT_PACKAGES, _tools_present)
    if missing:
        pytest.skip(missing)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "torch_keeps_threads(reason): torch itself keeps a thread pool alive after this test "
                   "(e.g. inductor's compile workers); not a torchpace leak")


@pytest.fixture
def own_leftovers(request):
    """A function listing processes still alive that this very test started (directly or not):
    found by the PYTEST_CURRENT_TEST value every child inherits, and started after the test began."""
    import time

    import psutil

    start = time.time() - 1
    nodeid = request.node.nodeid

    def find(cmd_part: str) -> list:
        found = []
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            try:
                if (proc.info["create_time"] >= start and cmd_part in " ".join(proc.info["cmdline"] or [])
                        and proc.environ().get("PYTEST_CURRENT_TEST", "").startswith(nodeid)):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # it ended while we looked: not left behind
        return found

    return find


@pytest.fixture(scope="session")
def postgres():
    """A throw-away PostgreSQL server for the session (tests/_postgres.py): Debian's server is installed
    with apt-get when missing and root; elsewhere without its binaries the test is skipped, saying why."""
    from _postgres import ThrowawayPostgres, install_server

    missing = install_server()
    if missing:
        pytest.skip(missing)
    server = ThrowawayPostgres.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slurm():
    """A throw-away two-node SLURM cluster on this host for the session (tests/_slurm.py): slurm-wlm and munge are
    installed with apt-get when missing and root; elsewhere the test is skipped, saying why."""
    from _slurm import ThrowawaySlurm, install

    missing = install()
    if missing:
        pytest.skip(missing)
    cluster = ThrowawaySlurm.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB filesystem (tmpfs) mounted under tmp_path; root only."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem to fill needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True, timeout=30)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True, timeout=30)


@pytest.fixture
def full_disk(small_disk):
    """`small_disk` filled to the last byte: every write into it fails with ENOSPC."""
    from _support import fill_disk

    fill_disk(small_disk)
    return small_disk


@pytest.fixture
def read_only_folder(tmp_path):
    """A function that puts files ({name: text}) in a fresh folder and makes it read-only, returning it: a real
    read-only filesystem (a tmpfs remounted `ro`) as root, whom modes do not stop; else a folder of mode 0555."""
    import subprocess

    mounted = []

    def make(files: dict) -> "Path":
        folder = tmp_path / "read-only"
        folder.mkdir()
        if os.geteuid() == 0:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)], check=True, timeout=30)
            mounted.append(folder)
        for name, text in files.items():
            (folder / name).write_text(text)
        if os.geteuid() == 0:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, timeout=30)
        else:
            folder.chmod(0o555)
        return folder

    yield make
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=True, timeout=30)
    if (tmp_path / "read-only").exists() and os.geteuid() != 0:
        (tmp_path / "read-only").chmod(0o755)


@pytest.fixture
def short_tmpdir():
    """A fresh folder with a short path, to be a child's TMPDIR (a test's own tmp_path can be too long for the
    AF_UNIX sockets multiprocessing puts there: 107 bytes at most); removed afterwards."""
    import shutil
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="tp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def latency_tune(tmp_path_factory, host):
    """A real latency tune (tests/inference, and the report that reads its study back): a planted model whose
    int8 version is wrong and that torch.export cannot capture; (outcome, folder of its s.db and files).
    It ends when every slot is decided (a minute or two); the budget is only a bound below the test's
    timeout, so that a loaded host's slower trials are not cut short."""
    from pathlib import Path

    from torchpace.tune.tuner import TuneOptions, Tuner

    tmp = tmp_path_factory.mktemp("latency-tune")
    planted = Path(__file__).parent / "inference" / "inference_planted.py"
    options = TuneOptions(workload=f"{planted}:branchy_breaks_under_int8", storage=f"sqlite:///{tmp / 's.db'}",
                          out=tmp / "torchpace.toml", knobs=frozenset({"inference.quantize", "inference.export"}),
                          objective="latency", trial_time_s=1.0, budget_s=800, profile_baseline=False,
                          export_path=tmp / "model.pt2")
    return Tuner(options, host).run(), tmp
