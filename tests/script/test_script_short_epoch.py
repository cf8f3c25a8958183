"""A script whose run is one 20-step epoch (then evaluation, a checkpoint and its exit), tuned while the host
slows down after its baseline: the trials follow its real step times, its end is no stall and no budget cut."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.slow
def test_a_short_scripts_trials_follow_its_step_times_and_its_end_is_neither_a_stall_nor_a_budget_cut(cli_run, tmp_path):
    # the baseline's two runs take 0.1 s a step, every later run 0.4 s: a quiet moment, then a busy host
    command = ["python", str(SCRIPTS / "short_epoch.py"), "--step-ms", "100", "--slow-ms", "400", "--runs-file",
               str(tmp_path / "runs.txt"), "--output-dir", str(tmp_path / "out")]
    result = cli_run("-v", "tune", "--budget", "15m", "--trial-time", "20", "--guard-steps", "5", "--max-trials", "4",
                     "--knob", "optimizer.impl", "--json", "--", *command, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout)
    trials = outcome["trials"]
    if outcome["best_config"]:  # the kept config ran the script to its end, through its checkpoint (--run-on)
        run_on = outcome["run_on"]
        assert run_on["status"] == "ended" and any(e.startswith("save at ") for e in run_on["events"]), run_on
    else:
        assert outcome["run_on"] is None
    assert trials[0]["slot"] == "baseline" and trials[0]["status"] == "ok", trials[0]
    fitted = float(re.search(r"now measures for ([0-9.]+) s", result.stderr).group(1))
    # the budget held every trial: none of them is "cut by the budget", and none was taken for a stall
    assert [t["status"] for t in trials] == ["ok"] * len(trials), [(t["slot"], t["status"], t["error"]) for t in trials]
    assert "stalled" not in result.stderr and "made no step" not in result.stderr
    # once trials ran at 0.4 s a step, each later one measures for the share of what the script's 19 steps take
    # at that pace, not for the seconds its quiet baseline took
    sized = [float(s) for s in re.findall(r"the trial measures for ([0-9.]+) s: 19 steps", result.stderr)]
    assert sized and max(sized) > fitted, (fitted, sized)
