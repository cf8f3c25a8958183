"""Every command torchpace prints for a user to copy is quoted for the shell by one rule (`shlex.join`):
pasted, it runs exactly the words it names, whatever they hold (spaces, quotes, empty strings, `$(...)`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

# arguments a real training command may hold, each of which breaks a command joined with spaces
HARD_ARGS = ("--output-dir", "", "--run-name", "a b", "--note", "it's \"quoted\"", "--tag", "$(touch pwned)",
             "--glob", "*.jpg", "--sep", ";")
COMMAND = ("python", "train me.py", *HARD_ARGS)


def _after_dashes(line: str) -> list[str]:
    words = shlex.split(line)
    return words[words.index("--") + 1:]


def test_profile_remedies_name_the_script_command_exactly():
    from torchpace.profile.verdict import build_verdict, verb_command

    verdict = build_verdict([], workload_spec=COMMAND)
    commands = [f.remedy.command for f in verdict.remedies if f.remedy and f.remedy.command]
    assert commands, verdict.remedies
    for line in commands:
        assert shlex.split(line)[:2] == ["torchpace", "bench"] and _after_dashes(line) == list(COMMAND), line
    assert _after_dashes(verb_command("tune", COMMAND)) == list(COMMAND)


def test_a_workload_spec_with_a_space_is_one_word_of_the_remedy():
    from torchpace.profile.verdict import build_verdict

    spec = "my models/w.py:build"
    verdict = build_verdict([], workload_spec=spec)
    line = next(f.remedy.command for f in verdict.remedies if f.remedy and f.remedy.command)
    assert shlex.split(line)[:3] == ["torchpace", "bench", spec] and "--" not in shlex.split(line), line


def test_a_script_trial_is_labelled_and_its_failure_named_with_the_command_quoted(tmp_path):
    from torchpace.config import RunConfig
    from torchpace.trial.script import read_script_result, script_trial_spec

    spec = script_trial_spec(COMMAND, RunConfig(), 5.0)
    assert shlex.split(spec.workload) == list(COMMAND)
    failed = read_script_result(spec, tmp_path / "result.json", 3, "", 1.0)
    named = failed.error.split("`")[1]
    assert shlex.split(named) == list(COMMAND), failed.error


def test_a_study_s_command_in_a_message_is_quoted():
    from torchpace.tune.study import _shown

    assert _shown(COMMAND) == f"`{shlex.join(COMMAND)}`"


def test_tune_says_how_to_launch_its_config_with_the_real_command(tmp_path):
    import io

    from rich.console import Console

    from torchpace.tune.render import launch_hint

    out = tmp_path / "my configs" / "tuned.toml"
    line = launch_hint(out, COMMAND)
    assert shlex.split(line.split(" or ", 1)[1].strip(")")) == ["torchpace", "launch", "--config", str(out), "--", *COMMAND]
    buffer = io.StringIO()
    Console(file=buffer, width=400).print(line)
    assert "torchpace launch" in buffer.getvalue()


def test_launch_dry_run_prints_a_command_that_pastes_back_to_the_same_words(cli_run, tmp_path):
    (tmp_path / "train me.py").write_text("print('ran')\n")
    done = cli_run("launch", "--dry-run", "--", *COMMAND)
    assert done.returncode == 0, done.stderr
    line = done.stdout.splitlines()[1]
    assert shlex.split(line)[-len(HARD_ARGS) - 1:] == ["train me.py", *HARD_ARGS], line
    done = cli_run("launch", "--dry-run", "--json", "--", *COMMAND)
    assert shlex.split(json.loads(done.stdout)["command"])[-len(HARD_ARGS):] == list(HARD_ARGS)
    assert not (tmp_path / "pwned").exists()


def test_a_workload_and_a_command_together_name_the_command_quoted(cli_run, tmp_path):
    (tmp_path / "train me.py").write_text("")
    done = cli_run("bench", "tabular", "--", *COMMAND)
    assert done.returncode == 2, done.stderr
    named = done.stderr.split("command after `--` (", 1)[1].split("), not both")[0]
    assert shlex.split(eval(named)) == list(COMMAND), done.stderr


_SCRIPT = (
    "import argparse, torch\n"
    "p = argparse.ArgumentParser()\n"
    "for name in ('--output-dir', '--run-name', '--note', '--tag', '--glob', '--sep'):\n"
    "    p.add_argument(name, required=True)\n"
    "a = p.parse_args()\n"
    "assert a.output_dir == '' and a.run_name == 'a b' and a.tag == '$(touch pwned)', a\n"
    "m = torch.nn.Linear(16, 1)\n"
    "opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
    "for _ in range(20000):\n"
    "    opt.zero_grad(); m(torch.randn(32, 16)).sum().backward(); opt.step()\n")


@pytest.mark.slow
def test_a_script_s_bench_and_profile_print_commands_that_paste_back_to_the_same_words(cli_run, tmp_path):
    (tmp_path / "train me.py").write_text(_SCRIPT)
    done = cli_run("bench", "--max-time", "2", "--", *COMMAND, env_extra={"COLUMNS": "400"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    title = " ".join(line.strip() for line in lines[:next(i for i, line in enumerate(lines) if line.lstrip()[:1] in "┏┌")])
    assert f"torchpace bench: {shlex.join(COMMAND)} on cpu" in title, done.stdout
    done = cli_run("profile", "--steps", "2", "--python-steps", "0", "--json", "--trace", "t.json.gz", "--", *COMMAND)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert shlex.split(result["workload"]) == list(COMMAND)
    commands = [f["remedy"]["command"] for f in result["verdict"]["remedies"] if (f.get("remedy") or {}).get("command")]
    assert commands and all(_after_dashes(line) == list(COMMAND) for line in commands), commands
    assert not Path(tmp_path / "pwned").exists()
