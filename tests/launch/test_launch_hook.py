"""The sitecustomize hook: a config's global and DataLoader knobs reach an unmodified script, also over
the arguments it passes itself (each change reported), and a script that never imports torch pays
(almost) nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _support import FAKED_HOSTS, faked_host, faked_host_env
from launch_helpers import WORKERS, run_launch
from torchpace.knobs import get_knob
from torchpace.script.inprocess import loader_overrides
from torchpace.launch.plan import CONFIG_ENV
from torchpace.script.spec import HOOK_DIR

CONFIG = """\
schema_version = 1
[knobs]
"precision.matmul" = "medium"
"backends.cudnn_benchmark" = true
"data.num_workers" = 2
"data.prefetch_factor" = 4
"data.persistent_workers" = true
"""
BF16 = '"precision.amp" = "bf16"\n'  # only where the host computes bf16 natively (launch refuses it elsewhere)


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


def test_hook_gives_every_loader_the_config_and_reports_what_it_changed(child_env, shadowed_sitecustomize):
    # the hook itself, given the config as launch would (launch refuses the CUDA-only knobs on a CPU host)
    values = {"precision.matmul": "medium", "backends.cudnn_benchmark": True, "data.num_workers": 2,
              "data.prefetch_factor": 4, "data.persistent_workers": True}
    env = {**child_env, "PYTHONPATH": f"{HOOK_DIR}:{shadowed_sitecustomize}", CONFIG_ENV: json.dumps(values)}
    result = subprocess.run([sys.executable, str(WORKERS / "hook_probe.py")], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["matmul"] == "medium" and seen["cudnn_benchmark"] is True
    assert seen["plain"] == {"num_workers": 2, "pin_memory": False, "prefetch_factor": 4, "persistent_workers": True, "batch_size": 1}
    assert seen["subclass"]["num_workers"] == 2 and seen["subclass"]["batch_size"] == 2
    # the script's own num_workers=0 / =1 is what a tuned config changes: it reaches those loaders too
    assert seen["explicit_kw"] == {"num_workers": 2, "pin_memory": False, "prefetch_factor": 4,
                                   "persistent_workers": True, "batch_size": 1}
    assert seen["explicit_positional"]["num_workers"] == 2 and seen["explicit_positional"]["batch_size"] == 4
    assert seen["iterable"]["num_workers"] == 0  # an IterableDataset would be read once per worker
    assert seen["sitecustomize_marker"] == "ran"
    assert "DataLoader at" in result.stderr and "hook_probe.py" in result.stderr and "num_workers 0 -> 2" in result.stderr
    assert "num_workers 1 -> 2" in result.stderr


@pytest.mark.parametrize("host_name", sorted(FAKED_HOSTS))
def test_hook_is_cheap_when_torch_is_never_imported(host_name, tmp_path, child_env, shadowed_sitecustomize):
    config_file = tmp_path / "torchpace.toml"
    config_file.write_text(CONFIG + (BF16 if faked_host(host_name).native_bf16 else ""))
    env = {**child_env, "PYTHONPATH": str(shadowed_sitecustomize), **faked_host_env(host_name)}
    seen, _ = _launch_json(["--config", str(config_file), "--", str(WORKERS / "no_torch.py")], env)
    assert seen == {"torch": False, "torchpace": False, "chained": "ran"}


def test_loader_overrides_change_what_the_script_passed_and_say_from_what():
    knobs = [(get_knob("data.num_workers"), 4), (get_knob("data.prefetch_factor"), 8),
             (get_knob("data.persistent_workers"), True)]
    assert loader_overrides(knobs, {}) == {"num_workers": (None, 4, "data.num_workers"),
                                          "prefetch_factor": (None, 8, "data.prefetch_factor"),
                                          "persistent_workers": (None, True, "data.persistent_workers")}
    assert loader_overrides(knobs, {"num_workers": 0})["num_workers"] == (0, 4, "data.num_workers")
    changed = loader_overrides(knobs, {"num_workers": 4, "prefetch_factor": 8, "persistent_workers": False})
    assert changed == {"persistent_workers": (False, True, "data.persistent_workers")}  # equal values are no change


def test_hook_constant_matches_the_planner():
    assert f'_CONFIG_ENV = "{CONFIG_ENV}"' in (HOOK_DIR / "sitecustomize.py").read_text()


def test_a_config_the_hook_cannot_apply_is_reported_and_the_script_still_runs(child_env):
    env = {**child_env, "PYTHONPATH": str(HOOK_DIR), CONFIG_ENV: json.dumps({"precision.matmul": "lowest"})}
    script = "import torch; print(torch.get_float32_matmul_precision())"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "highest"
    assert "torchpace launch: the config was not applied" in result.stderr and "lowest" in result.stderr
