"""A published-style training script (scripts/reference_train.py: `--workers`, `--output-dir`, its own loader and
optimizer arguments) run as it is: what it ran with is the baseline, read from its own arguments and said so,
and every knob set reaches it whatever its value, the default included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
# a reference-style command: 2 workers kept between epochs, nothing saved (`--output-dir ''`), one short epoch
COMMAND = ["python", str(SCRIPTS / "reference_train.py"), "--workers", "2", "--persistent-workers", "--output-dir", "",
           "--print-freq", "1000", "--samples", "256"]
OWN = {"data.num_workers": 2, "data.pin_memory": True, "data.prefetch_factor": 2, "data.persistent_workers": True,
       "optimizer.impl": "default"}


@pytest.mark.slow
def test_a_bench_reads_the_scripts_own_settings_and_a_set_default_replaces_them(cli_run, tmp_path):
    own = cli_run("bench", "--max-time", "3", "--out", "own.json", "--", *COMMAND, "--report", "own-seen.json",
                  timeout=400)
    assert own.returncode == 0, own.stderr[-3000:]
    bench = json.loads((tmp_path / "own.json").read_text())
    assert bench["config"] == {} and bench["script"]["script_settings"] == OWN
    assert "the script's own settings" in own.stdout and "(defaults)" not in own.stdout
    assert "num_workers=2" in own.stdout  # what it ran with, said

    zero = cli_run("bench", "--max-time", "3", "--set", "data.num_workers=0", "--json", "--", *COMMAND,
                   "--report", "zero-seen.json", timeout=400)
    assert zero.returncode == 0, zero.stderr[-3000:]
    bench = json.loads(zero.stdout)
    seen = json.loads((tmp_path / "zero-seen.json").read_text())  # what the script's DataLoader got
    assert seen["num_workers"] == 0 and seen["persistent_workers"] is False  # no worker option without workers
    assert bench["config"] == {"data.num_workers": 0}
    changed = {(c["argument"], c["old"], c["new"]) for c in bench["script"]["overrides"]}
    assert ("num_workers", 2, 0) in changed and ("persistent_workers", True, False) in changed
    assert bench["script"]["script_settings"] == OWN  # its own, as it passed them, before the knob


def test_a_set_default_on_a_script_that_builds_no_dataloader_is_invalid_not_ignored(cli_run):
    result = cli_run("bench", "--max-time", "4", "--set", "data.num_workers=0", "--",
                     "python", str(SCRIPTS / "brief_manual.py"), "20", timeout=240)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "data.num_workers: never took effect in the script: it built no torch.utils.data.DataLoader" in result.stderr


@pytest.mark.slow
def test_a_tune_judges_a_worker_option_on_the_workers_the_script_runs_with(cli_run):
    # the script's loader has 2 workers of its own: prefetching is a change to compare, not a config without workers
    result = cli_run("tune", "--run-on", "0", "--knob", "data.prefetch_factor", "--budget", "3m", "--trial-time", "3", "--max-trials", "3",
                     "--json", "--storage", "sqlite:///studies.db", "--out", "tuned.toml", "--",
                     *COMMAND[:-1], "4096", timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    trials = json.loads(result.stdout)["trials"]
    prefetch = [t for t in trials if "data.prefetch_factor" in t["config"]]
    assert prefetch and all(t["status"] != "invalid" for t in prefetch), prefetch
