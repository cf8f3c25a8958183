"""A script's own output in script mode: kept in a log file per bench / profile / trial (its path said),
streamed on request (`--show-output`), and its last lines shown when it fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchpace.trial.output import plan_log_path, trial_log_path

SCRIPTS = Path(__file__).parent / "scripts"


def test_log_paths_name_the_verb_the_script_and_the_trial():
    from datetime import datetime

    path = plan_log_path("bench", ["python", "train_pl.py", "--epochs", "3"], now=datetime(2024, 5, 1, 12, 0, 7), pid=42)
    assert path == Path(".torchpace/logs/bench-train_pl-20240501-120007-42.log")
    assert plan_log_path("profile", ["python", "-m", "pkg.train"], pid=1).name.startswith("profile-pkg.train-")
    assert trial_log_path("torchpace-train_pl.py", 7) == Path(".torchpace/logs/torchpace-train_pl.py/trial-7.log")
    spaced = trial_log_path("torchpace-train pl.py", 7)  # a name changed for its folder carries a digest of itself
    assert spaced.name == "trial-7.log" and spaced.parent.name.startswith("torchpace-train_pl.py~")


@pytest.mark.slow
def test_bench_keeps_the_scripts_output_says_where_and_streams_it_on_request(cli_run, tmp_path):
    """One run, with --show-output: the log holds what it streamed (that nothing is streamed unless asked is
    checked on the bench of tests/script/test_script_labels.py)."""
    result = cli_run("bench", "--max-time", "3", "--json", "--show-output", "--set", "optimizer.impl=foreach", "--",
                     "python", str(SCRIPTS / "chatty.py"), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    said = re.search(r"the script's output is in (\S+\.log)", result.stderr)
    assert said, result.stderr
    log = tmp_path / said.group(1)
    text = log.read_text()
    assert "chatty: starting (stderr)" in text and "chatty: step 3 (stdout)" in text  # both streams, in one file
    assert "foreach None -> True (optimizer.impl)" in text  # what the hook changed, where the script's output is
    assert json.loads(result.stdout)["script"]["output_log"] == said.group(1)
    assert "chatty: starting (stderr)" in result.stderr and "chatty: step 3 (stdout)" in result.stderr  # streamed


def test_show_output_without_a_script_is_a_usage_error(cli_run):
    result = cli_run("bench", "tabular", "--show-output", timeout=120)
    assert result.returncode == 2 and "--show-output streams the output of a script" in result.stderr


def test_the_bench_table_shows_what_was_compiled_and_where_the_output_is():
    from torchpace.measure.render import script_rows
    from torchpace.measure.result import ScriptInfo
    from torchpace.records import from_json

    script = from_json(ScriptInfo, {
        "step_source": "optimizer", "output_log": ".torchpace/logs/bench-train-20240501-120007-42.log",
        "compile": {"mode": "default", "modules": ["GPT2LMHeadModel"], "graphs": 2, "graph_breaks": 3,
                    "break_reasons": {"logging.Logger method not supported for non-export cases": 3}}})
    rows = dict(script_rows(script))
    assert rows["compiled"] == ("GPT2LMHeadModel after the first step (default): 2 graph(s), 3 graph break(s) "
                                "(logging.Logger method not supported for non-export cases x3)")
    assert rows["script output"] == ".torchpace/logs/bench-train-20240501-120007-42.log"
