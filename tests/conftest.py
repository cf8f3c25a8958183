"""Shared test fixtures. Hygiene: a test that leaks environment variables or threads fails."""

from __future__ import annotations

import os
import threading

import pytest


# Set by pytest itself, or by torch's lazily imported modules (inductor writes its cache dir into
# os.environ on first import); not torchpace's doing.
_ENV_SET_BY_OTHERS = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_", "_TORCHINDUCTOR_", "TRITON_")


@pytest.fixture(autouse=True)
def _no_env_or_thread_leaks():
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
    assert not leaked, f"test leaked threads: {[t.name for t in leaked]}"


FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures"


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


def fixture_workload(name: str) -> str:
    """Workload spec of a planted workload in tests/fixtures/workloads.py."""
    return f"{FIXTURES / 'workloads.py'}:{name}"
