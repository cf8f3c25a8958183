"""Shared test fixtures. Hygiene: a test that leaks environment variables or threads fails."""

from __future__ import annotations

import os
import threading

import pytest


@pytest.fixture(autouse=True)
def _no_env_or_thread_leaks():
    env_before = dict(os.environ)
    threads_before = {t.ident for t in threading.enumerate()}
    yield
    env_after = dict(os.environ)
    changed = {k for k in env_before.keys() | env_after.keys() if env_before.get(k) != env_after.get(k)}
    os.environ.clear()
    os.environ.update(env_before)
    assert not changed, f"test changed os.environ: {sorted(changed)}"
    leaked = [
        t for t in threading.enumerate()
        if t.ident not in threads_before and t.is_alive() and not t.daemon and t is not threading.current_thread()
    ]
    assert not leaked, f"test leaked threads: {[t.name for t in leaked]}"
