"""PyTorch Lightning and the Hugging Face `Trainer` as script-mode clients: the two example scripts
(examples/scripts/lightning_train.py, hf_trainer_train.py: a model built from a config, random data,
nothing downloaded) benched, profiled, tuned and launched as a user would, unmodified.

Each run is shared by several assertions (the frameworks' imports take seconds): for each framework, one
bench with every knob that reaches a script and applies on this host, checked against the framework's own
clock on the same run (a timestamp per optimizer step from a Lightning callback / a `TrainerCallback`) and
against the DataLoader and optimizer the framework really built, and one profile. The short tune and the
launch of what it wrote run on Lightning only (its closure optimizer under the guard, and compile.mode
reaching a framework's model from outside): a tune is five framework processes, and what it adds for the
Trainer (optimizer.impl inside the framework, the launch hook) the Trainer's bench already checks with
the same hook.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from _support import DECIDED_ENV, assert_windows_match_stamps
from torchpace.knobs import REGISTRY
from torchpace.profile.effect import settings_in_effect
from torchpace.profile.trace import read_trace
from torchpace.script.knobs import script_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scripts"
PHASES = ("input_wait", "h2d", "forward", "backward", "optimizer", "other")
# Hugging Face: never reach the Hub (the model comes from a config), and no telemetry
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}

pytestmark = [pytest.mark.slow, pytest.mark.frameworks]


@dataclass(frozen=True)
class Client:
    """One framework's example script and what its steps hold."""

    name: str
    module: str  # what must import for the framework to be there
    script: str
    args: tuple[str, ...]  # the training run (long enough for every trial)
    short_args: tuple[str, ...]  # a run that ends by itself, for launch
    samples_per_step: int
    accumulation: int
    model: str  # the outermost module with parameters the framework calls
    tune_knobs: tuple[str, ...]


CLIENTS = {
    "lightning": Client("lightning", "pytorch_lightning", "lightning_train.py", ("--epochs", "1000"),
                        ("--epochs", "1", "--samples", "2048"), 64, 1, "Classifier", ("compile.mode",)),
    # two micro-batches of 8 per optimizer step: accelerate's accumulation, counted as one step of 16 samples
    "hf": Client("hf", "transformers", "hf_trainer_train.py", ("--grad-accum", "2", "--max-steps", "100000"),
                 ("--grad-accum", "2", "--max-steps", "30"), 16, 2, "GPT2LMHeadModel", ("optimizer.impl",)),
}
TUNED = ["lightning"]  # the framework tuned and launched (see the module docstring)


@pytest.fixture(scope="module", params=sorted(CLIENTS))
def client(request) -> Client:
    chosen = CLIENTS[request.param]
    pytest.importorskip(chosen.module, reason="the frameworks extra is not installed (pip install -e '.[test]')")
    return chosen


@pytest.fixture(scope="module")
def folder(client, tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp(f"framework-{client.name}")


def _env(folder: Path) -> dict[str, str]:
    """The environment a user would run in, with the framework offline and its caches in `folder`.
    One OpenMP thread: on a host whose two cores other processes keep busy, two threads stall at their
    barriers (steps of 3 ms take 3-150 ms), which is the host, not what these tests check."""
    env = {k: v for k, v in os.environ.items() if k not in DECIDED_ENV}
    return {**env, **OFFLINE, "HF_HOME": str(folder / "hf-home"), "XDG_CACHE_HOME": str(folder / "cache"),
            "OMP_NUM_THREADS": "1"}


def _torchpace(folder: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchpace", *args], cwd=folder, env=_env(folder),
                          capture_output=True, text=True, timeout=timeout)


def _command(client: Client, *extra: str) -> list[str]:
    return ["python", str(EXAMPLES / client.script), *client.args, *extra]


def _reaching_config(host) -> dict:
    """A knob of each kind that reaches a script and applies on this host (bf16 only where it is native)."""
    config = {"threads.intra_op": 1, "data.num_workers": 1, "optimizer.impl": "foreach"}
    target = script_target("train.py")
    amp = REGISTRY["precision.amp"]
    if amp.applies(host, target) is None and amp.host_reason("bf16", host) is None:
        config["precision.amp"] = "bf16"
    return config


# ---- bench: the framework's own clock, samples, and every knob inside the framework ---------------------------

@pytest.fixture(scope="module")
def bench(client, folder, host):
    config = _reaching_config(host)
    stamps, report = folder / "bench-stamps.txt", folder / "bench-seen.json"
    sets = [part for name, value in config.items() for part in ("--set", f"{name}={json.dumps(value).strip(chr(34))}")]
    # 20 s: room for two complete windows after warm-up even on a loaded host (see tests/script/test_script_bench.py)
    result = _torchpace(folder, "bench", "--max-time", "20", "--json", *sets, "--",
                        *_command(client, "--stamps", str(stamps), "--report", str(report)))
    assert result.returncode == 0, result.stderr[-4000:]
    payload = json.loads(result.stdout)
    return config, payload, stamps, report, (folder / payload["script"]["output_log"]).read_text()


def test_steps_per_s_is_the_frameworks_own_clock_on_the_same_run(bench):
    """torchpace's windows against the framework callback's timestamps of the very same optimizer steps."""
    _, result, stamps, _, _ = bench
    assert_windows_match_stamps(result, stamps)


def test_samples_per_step_are_the_frameworks_batches(bench, client):
    _, result, _, _, _ = bench
    script = result["script"]
    assert script["step_source"] == "optimizer" and script["samples_source"] == "dataloader"
    assert result["batch_size"] == client.samples_per_step and result["grad_accumulation"] == client.accumulation
    assert result["samples_per_s"] == pytest.approx(client.samples_per_step * result["steps_per_s"], rel=1e-9)


def test_every_reached_knob_takes_effect_inside_the_framework(bench, client):
    config, result, _, report, output = bench
    seen = json.loads(report.read_text())  # read from the framework's own DataLoader and optimizer
    assert seen["threads"] == 1 and seen["num_workers"] == 1
    assert seen["foreach"] is True and not seen["fused"]  # the Trainer asks for fused itself: overridden, and said
    # every knob the hook applies in the script's process reached it (threads too: it keeps them over the script's
    # own set_num_threads); the others reached the process through its env
    assert sorted(result["script"]["reached"]) == sorted(k for k in config if REGISTRY[k].script_reach != "process"
                                                         or REGISTRY[k].script_guard)
    changed = {(c["argument"], repr(c["new"])) for c in result["script"]["overrides"]}
    assert ("num_workers", "1") in changed and ("foreach", "True") in changed
    assert "num_workers 0 -> 1 (data.num_workers)" in output  # said where the script's own output is kept
    assert result["config"] == config


# ---- profile: phases add up, and advice only for what applies ------------------------------------------------

@pytest.fixture(scope="module")
def profile(client, folder):
    result = _torchpace(folder, "profile", "--steps", "3", "--python-steps", "0", "--json", "--trace",
                        str(folder / "trace.json.gz"), "--", *_command(client))
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)


def test_profile_phases_partition_the_step(profile):
    split = next(f["data"] for f in profile["findings"] if f["id"] == "profile.step_split")
    assert split["labelled"] and sum(split[f"{p}_frac"] for p in PHASES) == pytest.approx(1.0, abs=0.02)
    assert all(split[f"{p}_frac"] > 0 for p in ("forward", "backward", "optimizer"))
    assert split["optimizer_frac"] < 0.9  # the closure's forward and backward are not the optimizer's


def test_profile_advises_only_knobs_that_apply_here_and_are_not_in_effect(profile, client, host):
    target = script_target(client.script)
    for remedy in profile["verdict"]["remedies"]:
        for name, value in re.findall(r"--set ([\w.]+)=(\S+)", remedy["remedy"]["command"] or ""):
            knob = REGISTRY[name]
            typed = knob.validate(json.loads(value) if value in ("true", "false") or value.isdigit() else value)
            assert knob.applies(host, target) is None and knob.host_reason(typed, host) is None, remedy
            assert knob.script_reason(typed) is None, remedy
    in_effect = settings_in_effect(read_trace(profile["trace_path"]))
    withheld = {item["knob"]: item["reason"] for item in profile["verdict"]["not_offered"]}
    if client.name == "hf":  # the Trainer's default optimizer is torch's fused AdamW: seen in the operators
        assert "_fused_adamw" in in_effect["optimizer.impl"]
        if profile["verdict"]["kind"] == "compute-bound":
            assert withheld["optimizer.impl"] == f"optimizer.impl: already in effect: {in_effect['optimizer.impl']}"
    else:  # Lightning steps the script's own AdamW, per parameter on a CPU: the multi-tensor one is offered
        assert "optimizer.impl" not in in_effect and "optimizer.impl" not in withheld


# ---- tune, short, and launch of what it wrote ----------------------------------------------------------------

@pytest.fixture(scope="module")
def tuned(client, folder):
    knobs = [part for name in client.tune_knobs for part in ("--knob", name)]
    # three trials (the baseline, the defaults against themselves, the first candidate against them): short by
    # count, whatever the host's speed; the budget is only a cap
    result = _torchpace(folder, "tune", "--run-on", "0", "--budget", "8m", "--max-trials", "3", "--trial-time", "4", "--guard-steps", "5",
                        *knobs, "--json", "--", *_command(client), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    with sqlite3.connect(folder / ".torchpace" / "studies.db") as db:
        stored = [json.loads(raw) for (raw,) in db.execute(
            "SELECT value_json FROM trial_user_attributes WHERE key = 'torchpace'")]
    return json.loads(result.stdout), stored


@pytest.mark.parametrize("client", TUNED, indirect=True)
def test_tune_judges_each_candidate_with_the_guard(tuned, client):
    outcome, stored = tuned
    trials = outcome["trials"]
    baselines = [t for t in trials if t["slot"] == "baseline"]
    assert baselines and all(t["status"] == "ok" for t in baselines), trials
    candidates = [t for t in trials if t["kind"] == "candidate"]
    assert {t["knob"] for t in candidates} == set(client.tune_knobs)
    for trial in candidates:
        assert trial["status"] in ("ok", "guard", "invalid"), trial
        if trial["status"] == "ok":
            assert len(trial["guard_losses"]) == 5 and trial["guard"] in ("pass", "fail")
        if trial["status"] == "invalid":
            assert trial["error"], trial
    compiled = [s for s in stored if (s.get("config") or {}).get("compile.mode", "off") != "off"]
    for trial in compiled:  # compile reached the script: the model compiled, or the compiler's reason
        if trial["status"] == "ok":
            summary = trial["bench"]["script"]["compile"]
            assert summary["modules"] == [client.model] and summary["graphs"] >= 1, summary
        else:
            assert trial["status"] in ("guard", "invalid") and "compile" in trial["error"], trial


@pytest.mark.parametrize("client", TUNED, indirect=True)
def test_launch_runs_the_tuned_config_inside_the_framework(tuned, client, folder):
    outcome, _ = tuned
    saved = tomllib.loads((folder / "torchpace.toml").read_text())
    assert saved["result"]["command"] == _command(client)
    report = folder / "launch-seen.json"
    run = subprocess.run([sys.executable, "-m", "torchpace", "launch", "--config", str(folder / "torchpace.toml"), "--",
                          "python", str(EXAMPLES / client.script), *client.short_args, "--report", str(report)],
                         cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    seen = json.loads(report.read_text())
    best = outcome["best_config"]
    if best.get("optimizer.impl") == "foreach":
        assert seen["foreach"] is True and not seen["fused"]
    if best.get("compile.mode", "off") != "off":
        assert f"torchpace: compiling {client.model} in place" in run.stderr
    clock = r"train_steps_per_second \S+" if client.name == "hf" else r"\d+\.\d+ steps/s \(Lightning callback clock\)"
    assert re.search(clock, run.stdout), run.stdout[-2000:]  # the framework's own figure, printed by the script
