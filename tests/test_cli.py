"""The `torchpace` command in real subprocesses: speed of --help, exit codes for bad input."""

import json
import subprocess
import sys

import pytest

from _support import FIXTURES, fixture_workload


def test_help_and_version_do_not_import_torch():
    code = ("import sys; from torchpace.cli import main\n"
            "for argv in (['--help'], ['--version'], ['bench', '--help'], ['knobs', '--help']):\n"
            "    rc = main(argv); assert rc == 0, (argv, rc)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "bench" in done.stdout and "Measure" in done.stdout


def test_console_script_and_module_agree():
    via_module = subprocess.run([sys.executable, "-m", "torchpace", "--version"], capture_output=True, text=True)
    via_script = subprocess.run([str(__import__("pathlib").Path(sys.executable).parent / "torchpace"), "--version"],
                                capture_output=True, text=True)
    assert via_module.stdout == via_script.stdout and "0.1.0" in via_module.stdout


@pytest.mark.parametrize("args, message", [
    (["bench", "no_such_pkg:fn"], "no module named 'no_such_pkg'"),
    (["bench", f"{FIXTURES / 'workloads.py'}:not_a_workload"], "expected a torchpace.Workload"),
    (["bench", "tabular", "--set", "data.num_worker=2"], "unknown knob 'data.num_worker'"),
    (["bench", "tabular", "--set", "precision.amp=fp8"], "valid values: off, bf16, fp16"),
    (["bench", "tabular", "--set", "precision.amp=fp16"], "needs CUDA"),
    (["bench", "tabular", "--max-time", "0"], "0.0 is not in the range 0<x<=604800.0"),
    (["bench", "tabular", "--out", "/no/such/dir/r.json"], "cannot be written"),
    (["knobs", "nope.py:fn"], "does not exist"),
])
def test_bad_input_exits_2_naming_what_was_wrong(cli_run, args, message):
    done = cli_run(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_malformed_and_newer_configs_exit_2_with_line_and_versions(cli_run, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = 1\n[knobs\n")
    done = cli_run("bench", "tabular", "--config", str(bad))
    assert done.returncode == 2 and "line 2" in done.stderr
    newer = tmp_path / "newer.toml"
    newer.write_text("schema_version = 2\n")
    done = cli_run("bench", "tabular", "--config", str(newer))
    assert done.returncode == 2 and "reads schema_version 1" in done.stderr


def test_exception_in_user_workload_exits_1_with_their_traceback(cli_run):
    done = cli_run("bench", fixture_workload("raises_in_loss"), "--max-time", "2")
    assert done.returncode == 1
    assert "traceback from YOUR code" in done.stderr and "planted failure inside the loss" in done.stderr


def test_bench_json_follows_the_documented_schema(cli_run, tmp_path):
    out = tmp_path / "r.json"
    done = cli_run("bench", fixture_workload("tiny_mlp"), "--max-time", "3", "--set", "data.num_workers=1",
                   "--json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    import jsonschema

    from torchpace.measure.schema import BENCH_RESULT_SCHEMA

    jsonschema.validate(payload, BENCH_RESULT_SCHEMA)
    assert payload["config"] == {"data.num_workers": 1}
    assert json.loads(out.read_text()) == payload


def test_bench_table_on_a_terminal_less_run(cli_run):
    done = cli_run("bench", fixture_workload("tiny_mlp"), "--max-time", "2")
    assert done.returncode == 0, done.stderr
    assert "samples/s (median)" in done.stdout and "95% CI of median" in done.stdout


def test_knobs_json_lists_every_knob_with_a_reason_or_candidates(cli_run):
    done = cli_run("knobs", fixture_workload("tiny_mlp"), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["knobs"]
    from torchpace.knobs import REGISTRY

    assert [r["name"] for r in rows if r["name"] in REGISTRY] and len(rows) == len(REGISTRY)
    assert all(r["candidates"] if r["applies"] else r["reason"] for r in rows)


def test_knobs_table_shows_every_knob_name_whole_at_80_columns(cli_run):
    from torchpace.knobs import REGISTRY

    done = cli_run("knobs", env_extra={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert max(map(len, done.stdout.splitlines())) <= 80
    assert [name for name in REGISTRY if name not in done.stdout] == []


def test_knobs_shows_a_workloads_own_loader_arguments_as_its_defaults(cli_run):
    done = cli_run("knobs", fixture_workload("tiny_mlp_with_workers"), "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)["knobs"]}
    workers = rows["data.num_workers"]
    assert workers["default"] == 2 and workers["candidates"][0] == 2 and 0 in workers["candidates"]
    assert rows["data.persistent_workers"]["default"] is True and rows["data.prefetch_factor"]["default"] == 2
