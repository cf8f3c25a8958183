"""Modules that must load without torch: the CLI's entry, the pure layers (config, knobs, plans,
checks, statistics, the tuner's policy and outcome, the guard's rule), the process toolkit, and the
verbs' paths that never run a model (`torchpace shard`). Each is imported in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

TORCH_FREE = (
    "torchpace", "torchpace.cli", "torchpace.logs", "torchpace.config", "torchpace.errors", "torchpace.findings", "torchpace.host",
    "torchpace.process", "torchpace.stop_policy", "torchpace.workload", "torchpace.knobs", "torchpace.knobs.base",
    "torchpace.data", "torchpace.data.scan", "torchpace.data.shards", "torchpace.data.cache",
    "torchpace.doctor.checks", "torchpace.doctor.probes", "torchpace.launch.plan", "torchpace.launch.execute",
    "torchpace.launch.torchrun", "torchpace.measure.stats", "torchpace.measure.timing", "torchpace.monitor.run",
    "torchpace.profile.trace", "torchpace.profile.analyzers", "torchpace.profile.verdict",
    "torchpace.report.load", "torchpace.protocol", "torchpace.trial.runner",
    "torchpace.tune.guard", "torchpace.tune.outcome", "torchpace.tune.policy", "torchpace.tune.study",
    "torchpace.tune.sampler", "torchpace.tune.space", "torchpace.tune.tuner",
)
_TIMEOUT_S = 120


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=_TIMEOUT_S)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_loads_without_torch(module):
    done = _run(f"import {module}, sys; assert 'torch' not in sys.modules, 'torch was imported'")
    assert done.returncode == 0, f"importing {module} loads torch:\n{done.stderr[-2000:]}"


def test_shard_writes_tar_files_without_torch_numpy_or_pillow(tmp_path):
    for label, name in (("cat", "a.jpg"), ("dog", "b.png")):
        (tmp_path / "src" / label).mkdir(parents=True)
        (tmp_path / "src" / label / name).write_bytes(b"not decoded: shards hold the bytes as they are")
    code = ("import sys; from torchpace.cli import main; "
            f"code = main(['shard', {str(tmp_path / 'src')!r}, '--out', {str(tmp_path / 'out')!r}]); "
            "heavy = [m for m in ('torch', 'numpy', 'PIL') if m in sys.modules]; "
            "assert not heavy, heavy; sys.exit(code)")
    done = _run(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.json", "shard-000000.tar"]
