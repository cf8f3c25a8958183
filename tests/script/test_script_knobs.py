"""Script-mode conformance: every knob that claims to reach an unmodified script (`Knob.script_reach`)
really changes what it claims, seen from inside a plain training script (scripts/knob_probe.py), both
under `torchpace launch --config` and in a script-mode bench (one hook path: what is measured is what runs), and
leaves what the script does with its model after training as it was without the knob: whole-module and
`state_dict` saves and loads, deep copies, evaluation, `torch.jit.trace`, `torch.export`, training again
(scripts/after_training.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _support import FAKED_HOSTS, faked_host, faked_host_env, hosts_where_verdicts_differ
from torchpace.knobs import REGISTRY
from torchpace.script.knobs import script_target

SCRIPTS = Path(__file__).parent / "scripts"

# knob -> (config to run, what the script must see: report key -> value)
CLAIMS = {
    "threads.intra_op": ({"threads.intra_op": 1}, {"threads": 1}),
    "system.allocator": ({"system.allocator": "jemalloc"}, {"allocator": "jemalloc"}),
    "system.numa": ({"system.numa": "bind"}, {}),  # checked by the affinity claim below
    "data.num_workers": ({"data.num_workers": 2}, {"num_workers": 2}),  # the script passes num_workers=0 itself
    "data.pin_memory": ({"data.pin_memory": True}, {"pin_memory": True}),
    "data.prefetch_factor": ({"data.num_workers": 1, "data.prefetch_factor": 4}, {"prefetch_factor": 4}),
    "data.persistent_workers": ({"data.num_workers": 1, "data.persistent_workers": True}, {"persistent_workers": True}),
    "precision.matmul": ({"precision.matmul": "high"}, {"matmul": "high"}),
    "backends.cudnn_benchmark": ({"backends.cudnn_benchmark": True}, {"cudnn_benchmark": True}),
    "optimizer.impl": ({"optimizer.impl": "fused"}, {"fused": True}),  # the script passes fused=False itself
    # bf16 inside the outermost forward only: the loss gets float32, the optimizer step runs outside autocast
    "precision.amp": ({"precision.amp": "bf16"}, {"autocast": True, "inner_dtype": "torch.bfloat16",
                                                  "output_dtype": "torch.float32", "autocast_in_step": False}),
    # the outermost conv model converted in place, and its 4-D inputs at every call
    "model.channels_last": ({"model.channels_last": True}, {"conv_channels_last": True, "input_channels_last": True}),
    # compiled in place after the first backward(): the script's own forward is traced by torch.compile
    "compile.mode": ({"compile.mode": "default"}, {"compiled": True}),
    # every DistributedDataParallel of a two-rank job under torchrun, over the script's own arguments
    # (scripts/ddp_probe.py passes bucket_cap_mb=50 and find_unused_parameters=True itself)
    "ddp.bucket_cap_mb": ({"ddp.bucket_cap_mb": 5}, {"bucket_cap_mb": 5}),
    "ddp.gradient_as_bucket_view": ({"ddp.gradient_as_bucket_view": True}, {"gradient_as_bucket_view": True}),
    "ddp.static_graph": ({"ddp.static_graph": True}, {"static_graph": True}),
    "ddp.find_unused_parameters": ({"ddp.find_unused_parameters": False}, {"find_unused_parameters": False}),
}
DDP_RANKS = 2  # the ddp.* knobs' claims run scripts/ddp_probe.py under `torchrun --nproc-per-node 2`
SCRIPT_KNOBS = sorted(name for name, knob in REGISTRY.items() if knob.script_reach)


def test_every_script_knob_has_a_claim():
    assert sorted(CLAIMS) == SCRIPT_KNOBS


def _skip_unless_it_applies(host, config):
    target = script_target("knob_probe.py")
    for name, value in config.items():
        reason = REGISTRY[name].applies(host, target) or REGISTRY[name].value_applies(value, host, target)
        if reason:
            pytest.skip(f"{name} does not apply on this host: {reason}")


def _launch(config: dict, tmp_path: Path, child_env: dict) -> dict:
    toml = tmp_path / "torchpace.toml"
    toml.write_text("schema_version = 1\n[knobs]\n" + "".join(f'"{k}" = {json.dumps(v)}\n' for k, v in config.items()))
    report = tmp_path / "seen.json"
    ddp = any(name.startswith("ddp.") for name in config)
    program = (["torchrun", f"--nproc-per-node={DDP_RANKS}", str(SCRIPTS / "ddp_probe.py")] if ddp
               else ["python", str(SCRIPTS / "knob_probe.py")])
    result = subprocess.run([sys.executable, "-m", "torchpace", "launch", "--config", str(toml), "--",
                             *program, str(report), "3"], env=child_env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    if not ddp:
        return json.loads(report.read_text())
    seen = [json.loads(Path(f"{report}.rank{rank}").read_text()) for rank in range(DDP_RANKS)]
    assert all(rank == seen[0] for rank in seen), seen  # every rank's DDP was given the same
    return seen[0]


AFTER_TRAINING = ["torch.save(model)", "state_dict", "deepcopy", "eval", "jit.trace", "export", "pickle", "train again"]


def _assert_life_after_training_as_without_knobs(seen: dict) -> None:
    assert list(seen["after"]) == AFTER_TRAINING
    broken = {step: verdict for step, verdict in seen["after"].items() if verdict != "ok"}
    assert not broken, broken


_HOSTS = {name: faked_host(name) for name in FAKED_HOSTS}


def _launch_params():
    """(knob, faked host): each knob under the first faked host, and under each other one where it gets another verdict."""
    for name in SCRIPT_KNOBS:
        for host_name in hosts_where_verdicts_differ(name, CLAIMS[name][0][name], script_target("knob_probe.py"), _HOSTS):
            yield pytest.param(name, host_name, id=f"{name}-{host_name}")


@pytest.mark.parametrize(("name", "host_name"), list(_launch_params()))
def test_script_knob_changes_what_it_claims_under_launch(name, host_name, tmp_path, child_env, request):
    config, expected = CLAIMS[name]
    child_env = {**child_env, **faked_host_env(host_name)}
    if name in ("system.allocator", "system.numa"):
        request.getfixturevalue("system_packages")  # jemalloc and numactl where apt is available
    host = faked_host(host_name)  # probed now: the tools may have just been installed
    _skip_unless_it_applies(host, config)
    seen = _launch(config, tmp_path, child_env)
    assert {key: seen[key] for key in expected} == expected
    _assert_life_after_training_as_without_knobs(seen)
    if name == "system.numa":
        assert set(seen["affinity"]) <= set(host.numa_nodes[0].cpus)


def test_defaults_leave_the_script_as_it_is(host, tmp_path, child_env):
    seen = _launch({}, tmp_path, child_env)
    assert (seen["num_workers"], seen["fused"], seen["autocast"], seen["output_dtype"]) == (0, False, False, "torch.float32")
    assert (seen["conv_channels_last"], seen["input_channels_last"]) == (False, False)
    assert seen["compiled"] is False
    _assert_life_after_training_as_without_knobs(seen)


def test_a_knob_a_host_cannot_run_is_refused_before_the_script_starts(cli_run, tmp_path):
    # bf16 autocast on a CPU without native bf16: exit 2 naming the missing feature, and the script never ran
    report = tmp_path / "seen.json"
    result = cli_run("bench", "--max-time", "3", "--set", "precision.amp=bf16", "--", "python",
                     str(SCRIPTS / "knob_probe.py"), str(report), env_extra=faked_host_env("no-bf16, one NUMA node"))
    assert result.returncode == 2 and "no native bf16" in result.stderr and not report.exists(), result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("host_name", sorted(FAKED_HOSTS))
def test_a_script_bench_applies_the_knobs_the_same_way(cli_run, tmp_path, host_name):
    # bf16 autocast where the (faked) host computes bf16, else the optimizer's fused kernel: each applies there
    report = tmp_path / "seen.json"
    knob, value, expected = (("precision.amp", "bf16", {"autocast": True, "output_dtype": "torch.float32"})
                             if faked_host(host_name).native_bf16 else ("optimizer.impl", "fused", {"fused": True}))
    result = cli_run("bench", "--max-time", "3", "--json", "--set", "data.num_workers=1", "--set", f"{knob}={value}",
                     "--", "python", str(SCRIPTS / "knob_probe.py"), str(report), "100000", timeout=240,
                     env_extra=faked_host_env(host_name))
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(report.read_text())
    assert seen["num_workers"] == 1 and {key: seen[key] for key in expected} == expected
    assert sorted(json.loads(result.stdout)["script"]["reached"]) == sorted(["data.num_workers", knob])
