"""`torchpace profile -- python SCRIPT` and `torchpace knobs -- python SCRIPT` on unmodified fixture scripts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.slow
def test_profile_of_a_script_labels_its_own_steps_and_gives_a_verdict(cli_run, tmp_path):
    trace = tmp_path / "trace.json.gz"
    result = cli_run("profile", "--steps", "3", "--python-steps", "1", "--trace", str(trace), "--json", "--",
                     "python", str(SCRIPTS / "loader_adamw.py"), "--work", "2", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads(result.stdout)
    document = json.loads(gzip.decompress(trace.read_bytes()))
    names = {event.get("name") for event in document["traceEvents"]}
    assert {"torchpace.input_wait", "torchpace.forward", "torchpace.backward", "torchpace.optimizer"} <= names
    assert sum(1 for name in names if str(name).startswith("ProfilerStep#")) == 3
    assert document["torchpace"]["workload"].endswith("loader_adamw.py --work 2")
    assert document["torchpace"]["batch_size"] == 32
    assert payload["verdict"]["kind"] in ("input-bound", "compute-bound", "host-sync-bound", "memory-bound")
    assert payload["trace_path"] == str(trace)


def test_profile_of_a_script_that_ends_first_is_its_failure(cli_run):
    result = cli_run("profile", "--steps", "5", "--", "python", str(SCRIPTS / "short_run.py"), "3", timeout=300)
    assert result.returncode == 1
    assert "ended after 3 step(s), before the profile's" in result.stderr


def test_knobs_for_a_script_say_how_each_reaches_it_or_the_prepare_change(cli_run, tmp_path):
    (tmp_path / "train.py").write_text("import torch\n")  # the script must exist; knobs never runs it
    result = cli_run("knobs", "--json", "--", "python", "train.py", timeout=120)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)["knobs"]}
    assert rows["data.num_workers"]["applies"] and "DataLoader" in rows["data.num_workers"]["reaches"]
    assert rows["model.activation_checkpointing"]["needs_prepare"] and "torchpace.prepare(" in rows["model.activation_checkpointing"]["prepare_change"]
    # fp16 reaches the script too (a GradScaler placed from outside), where the host runs it: CUDA only
    assert rows["precision.amp"]["prepare_values"] == [] and not rows["model.channels_last"]["needs_prepare"]
    assert "fp16" not in rows["precision.amp"]["candidates"]  # no CUDA here: refused by the host, not the script


@pytest.mark.slow
def test_profile_of_a_script_reads_the_other_load_as_a_workloads_profile_does(cli_run, tmp_path):
    """A process outside torchpace's tree keeps a core busy while the script's steps are traced: the profile
    reads it (`other_load_cores`) and says so beside its figures, as the Workload profile does."""
    import subprocess
    import sys

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        result = cli_run("profile", "--steps", "3", "--python-steps", "0", "--trace", str(tmp_path / "t.json.gz"),
                         "--json", "--", "python", str(SCRIPTS / "loader_adamw.py"), "--work", "2", timeout=300)
        plain = cli_run("profile", "--steps", "3", "--python-steps", "0", "--trace", str(tmp_path / "t.json.gz"),
                        "--", "python", str(SCRIPTS / "loader_adamw.py"), "--work", "2", timeout=300)
    finally:
        busy.kill()
        busy.wait()
    assert result.returncode == 0 and plain.returncode == 0, (result.stderr[-3000:], plain.stderr[-3000:])
    payload = json.loads(result.stdout)
    # the busy loop (and whatever else runs on this host) held at least half a core over the traced steps
    assert payload["other_load_cores"] is not None and payload["other_load_cores"] >= 0.5
    assert payload["usable_cores"] >= 1
    assert "while other processes used" in plain.stdout
