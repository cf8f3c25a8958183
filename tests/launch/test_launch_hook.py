"""The sitecustomize hook: a config's global and DataLoader knobs reach an unmodified script, explicit
arguments stay the script's, and a script that never imports torch pays (almost) nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch_helpers import WORKERS, run_launch
from torchpace.knobs import get_knob
from torchpace.launch.inprocess import loader_defaults
from torchpace.launch.plan import CONFIG_ENV
from torchpace.launch.probe import HOOK_DIR

CONFIG = """\
schema_version = 1
[knobs]
"precision.matmul" = "medium"
"backends.cudnn_benchmark" = true
"data.num_workers" = 2
"data.prefetch_factor" = 4
"data.persistent_workers" = true
"precision.amp" = "bf16"
"""


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "torchpace.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def shadowed_sitecustomize(tmp_path) -> Path:
    """A directory holding a user's own sitecustomize, which the hook must still run."""
    directory = tmp_path / "user-site"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(
        "import sys, types\nmarker = types.ModuleType('chained_marker')\nmarker.value = 'ran'\n"
        "sys.modules['chained_marker'] = marker\n")
    return directory


def _launch_json(args, env) -> tuple[dict, str]:
    result = run_launch(args, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_hook_changes_defaults_and_leaves_explicit_arguments(config_file, child_env, shadowed_sitecustomize):
    env = {**child_env, "PYTHONPATH": str(shadowed_sitecustomize)}
    seen, stderr = _launch_json(["--config", str(config_file), "--allocator", "system", "--",
                                 str(WORKERS / "hook_probe.py")], env)
    assert seen["matmul"] == "medium" and seen["cudnn_benchmark"] is True
    assert seen["plain"] == {"num_workers": 2, "pin_memory": False, "prefetch_factor": 4, "persistent_workers": True, "batch_size": 1}
    assert seen["subclass"]["num_workers"] == 2 and seen["subclass"]["batch_size"] == 2
    assert seen["explicit_kw"] == {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                                   "persistent_workers": False, "batch_size": 1}
    assert seen["explicit_positional"]["num_workers"] == 1 and seen["explicit_positional"]["batch_size"] == 4
    assert seen["explicit_positional"]["prefetch_factor"] == 4
    assert seen["iterable"]["num_workers"] == 0  # an IterableDataset would be read once per worker
    assert seen["sitecustomize_marker"] == "ran"
    assert "precision.amp" in stderr and "torchpace.prepare" in stderr


def test_hook_is_cheap_when_torch_is_never_imported(config_file, child_env, shadowed_sitecustomize):
    env = {**child_env, "PYTHONPATH": str(shadowed_sitecustomize)}
    seen, _ = _launch_json(["--config", str(config_file), "--", str(WORKERS / "no_torch.py")], env)
    assert seen == {"torch": False, "torchpace": False, "chained": "ran"}


def test_loader_defaults_never_override_what_the_script_passed():
    knobs = [(get_knob("data.num_workers"), 4), (get_knob("data.prefetch_factor"), 8),
             (get_knob("data.persistent_workers"), True)]
    assert loader_defaults(knobs, {}) == {"num_workers": 4, "prefetch_factor": 8, "persistent_workers": True}
    assert loader_defaults(knobs, {"num_workers": 0}) == {}
    assert loader_defaults(knobs, {"num_workers": 1, "prefetch_factor": 2}) == {"persistent_workers": True}


def test_hook_constant_matches_the_planner():
    assert f'_CONFIG_ENV = "{CONFIG_ENV}"' in (HOOK_DIR / "sitecustomize.py").read_text()


def test_a_config_the_hook_cannot_apply_is_reported_and_the_script_still_runs(child_env):
    env = {**child_env, "PYTHONPATH": str(HOOK_DIR), CONFIG_ENV: json.dumps({"precision.matmul": "lowest"})}
    script = "import torch; print(torch.get_float32_matmul_precision())"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "highest"
    assert "torchpace launch: the config was not applied" in result.stderr and "lowest" in result.stderr
