"""`benchmarks/gpu_check.py` (`make gpu-check`): what can be checked on a host without CUDA.

The CUDA run itself needs a GPU; here: the documented exit code without one, and the table built
from each verb's JSON through an injected command runner and clock.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _load():
    sys.path.insert(0, str(_SCRIPT.parent))  # as `python benchmarks/gpu_check.py` has it: its `_args`
    spec = importlib.util.spec_from_file_location("gpu_check", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _load()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA: the check would run")
def test_without_cuda_it_says_so_and_exits_77():
    done = subprocess.run([sys.executable, str(_SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == gpu_check.EXIT_NO_CUDA == 77
    assert "no CUDA device here" in done.stderr and "nothing was run" in done.stderr


def _answers(workdir: Path) -> dict[str, subprocess.CompletedProcess]:
    """What each verb printed on a CUDA host, as the runner returns it (the tune of vision failed)."""
    (workdir / "monitor.csv").write_text("t_s,cpu_pct,gpu0_util_pct\n0.5,40,97\n1.0,42,99\n")
    docs = {
        "doctor": {"findings": [{"id": "gpu.nvml", "severity": "ok", "evidence": "1 x NVIDIA H200, driver 570"},
                                {"id": "host.governor", "severity": "warn", "evidence": "powersave"}]},
        "bench": {"device": "cuda:0", "samples_per_s": 51234.0, "ci_rel_halfwidth": 0.012, "input_bound_frac": 0.02,
                  "peak_memory_bytes": 3 * 2**30},
        "tune": {"failed_baseline": None, "speedup": 2.5, "best_config": {"precision.amp": "bf16"},
                 "trials": [{"slot": "baseline", "status": "ok"}, {"slot": "cand:compile.mode=default", "status": "timeout"}]},
        "profile": {"device": "cuda:0", "verdict": {"kind": "input-bound"},
                    "findings": [{"id": "profile.gpu_idle", "evidence": "GPU idle 41% of the step"}]},
        "monitor": {"exit_code": 0},
        "compare": {"verdict": "faster", "mode": "alternating", "summary": "B is faster: 1.412x A (95% CI 1.390-1.430, 9 rounds)"},
    }
    return {verb: subprocess.CompletedProcess([], 0, json.dumps(doc), "") for verb, doc in docs.items()}


def test_the_table_has_one_row_per_step_with_its_figure_failure_or_skip(tmp_path):
    answers = _answers(tmp_path)
    ran = []

    def runner(argv, timeout_s, cwd):
        ran.append(argv[3:5])
        if argv[3:5] == ["profile", "vision"]:
            return subprocess.CompletedProcess(argv, 1, "", "Traceback...\nRuntimeError: CUPTI_ERROR_NOT_INITIALIZED\n")
        return answers[argv[3]]

    now = iter(range(0, 10_000, 50))  # every clock reading is 50 s later
    outcomes = gpu_check.run_check(gpu_check.plan_steps(tmp_path), tmp_path, 6 * 60, runner, clock=lambda: next(now))
    table = gpu_check.render_table(outcomes)
    by_name = {o.name: o for o in outcomes}
    assert by_name["bench language"].status == "ok" and "51,234 samples/s ±1.2%" in by_name["bench language"].detail
    assert by_name["tune language"].detail.startswith("2.50x with precision.amp=bf16")
    assert "cand:compile.mode=default: timeout" in by_name["tune language"].detail
    assert by_name["profile vision"].status == "FAIL" and "exit 1: RuntimeError: CUPTI" in by_name["profile vision"].detail
    assert by_name["doctor"].detail.startswith("0 fail, 1 warn; 1 x NVIDIA H200")
    # steps whose cap would end past the 6-minute box are skipped, not dropped
    assert [by_name[n].status for n in ("tune vision", "monitor (NVML)", "compare language")] == ["skipped"] * 3
    assert ["tune", "vision"] not in ran and ["monitor", "--interval"] not in ran
    assert len(table.splitlines()) == len(outcomes) + 3 and "steps ok" in table.splitlines()[-1]


def test_monitor_needs_nvml_figures_in_the_csv(tmp_path):
    _answers(tmp_path)
    assert gpu_check.read_monitor({"exit_code": 0}, tmp_path).startswith("2 samples, peak GPU utilisation 99%")
    (tmp_path / "monitor.csv").write_text("t_s,cpu_pct\n0.5,40\n")
    with pytest.raises(ValueError, match="no GPU utilisation column"):
        gpu_check.read_monitor({"exit_code": 0}, tmp_path)


def test_a_comparison_on_one_gpu_reads_its_verdict_and_fails_on_a_failed_arm(tmp_path):
    doc = json.loads(_answers(tmp_path)["compare"].stdout)
    assert gpu_check.read_compare(doc, tmp_path) == "B is faster: 1.412x A (95% CI 1.390-1.430, 9 rounds) (alternating)"
    with pytest.raises(ValueError, match="arm B"):
        gpu_check.read_compare({"verdict": "failed", "summary": "no ratio: arm B did not finish a measurement"}, tmp_path)


def test_the_speedup_part_fits_its_box_and_compares_the_tuned_config_with_the_defaults_and_the_experts(tmp_path):
    steps = gpu_check.plan_speedup_steps(tmp_path)
    assert [s.name for s in steps] == ["tune resnet (full)", "resnet tuned/default", "resnet tuned/expert",
                                       "tune gpt (full)", "gpt tuned/default", "gpt tuned/expert"]
    assert sum(s.cap_s for s in steps) <= 10 * 60
    compare = steps[1].args
    assert compare[compare.index("--config") + 1] == str(tmp_path / "resnet-default.toml")
    assert compare[-2:] == ("--size", "full") and compare[-3].endswith("resnet_train.py")
    assert str(tmp_path / "resnet-tuned.toml") in steps[0].args and str(tmp_path / "resnet-tuned.toml") in compare
    from _support import faked_host

    gpu_check.write_speedup_configs(tmp_path, faked_host("native bf16"))
    assert "[knobs]" in (tmp_path / "gpt-default.toml").read_text()
    assert '"model.channels_last" = true' in (tmp_path / "resnet-expert.toml").read_text()


def test_a_speedup_row_reads_the_ratio_its_ci_the_tuned_rate_and_its_mfu(tmp_path):
    read = gpu_check.speedup_reader("resnet", peak_flops=lambda: 989.4e12, flops=lambda: 24.3e9)
    doc = {"verdict": "faster", "ratio": 2.71, "ratio_ci_low": 2.65, "ratio_ci_high": 2.8, "unit": "samples/s",
           "b": {"figure": 3000.0}}
    assert read(doc, tmp_path) == "2.71x [2.65, 2.80], tuned 3,000 samples/s, MFU 7.4%"
    unknown = gpu_check.speedup_reader("resnet", peak_flops=lambda: None, flops=lambda: 24.3e9)
    assert unknown(doc, tmp_path).endswith("MFU - (GPU not in the table)")
    with pytest.raises(ValueError, match="an arm failed"):
        read({"verdict": "failed", "ratio": None, "summary": "an arm failed"}, tmp_path)


@pytest.mark.parametrize("text", ["0", "-1", "60", "90", "nan", "inf", "ten", ""])
def test_minutes_out_of_the_box_are_exit_2_in_minutes(text):
    done = subprocess.run([sys.executable, str(_SCRIPT), "--minutes", text, "--dry-run"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--minutes" in done.stderr and "minutes, a number above 0 and below 60" in done.stderr
    assert "seconds" not in done.stderr


def test_a_box_of_part_of_a_minute_is_named_as_given(tmp_path):
    outcomes = gpu_check.run_check(gpu_check.plan_steps(tmp_path), tmp_path, 15, lambda *a: None, clock=lambda: 0.0)
    assert {o.status for o in outcomes} == {"skipped"} and "the 0.25-minute time box" in outcomes[0].detail


def test_a_keep_that_cannot_be_a_folder_is_exit_2_naming_it(tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    for keep, said in ((tmp_path / "notes.txt", "it is a file"),
                       (tmp_path / "notes.txt" / "runs", "is a file, so no folder can be made under it"),
                       ("", "name a folder")):
        done = subprocess.run([sys.executable, str(_SCRIPT), "--keep", str(keep), "--dry-run"], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "--keep" in done.stderr and said in done.stderr, done.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_dry_run_names_the_folder_a_run_would_keep_and_makes_nothing(tmp_path):
    keep = tmp_path / "kept"
    done = subprocess.run([sys.executable, str(_SCRIPT), "--keep", str(keep), "--dry-run"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"sqlite:///{keep / 'run-1' / 'studies.db'}" in done.stdout and not keep.exists()


def _fake_gpu_host(workdirs):
    """A runner that answers as a CUDA host does (each verb's JSON), and records the folder each run used."""

    def runner(argv, timeout_s, cwd):
        workdirs.add(cwd)
        answers = _answers(cwd)
        return answers[argv[3]]

    return runner


def test_a_rerun_with_the_same_keep_starts_in_a_folder_of_its_own(tmp_path, capsys):
    """The studies a first run kept are never resumed or refused by the second (tune refuses an existing
    study without --resume): each run gets `run-N`, and what the first kept is left as it was."""
    keep = tmp_path / "kept"
    workdirs: set[Path] = set()
    assert gpu_check.main(["--keep", str(keep)], _fake_gpu_host(workdirs), cuda_absent=lambda: None) == 0
    (keep / "run-1" / "studies.db").write_bytes(b"first run's studies")
    assert gpu_check.main(["--keep", str(keep)], _fake_gpu_host(workdirs), cuda_absent=lambda: None) == 0
    assert workdirs == {(keep / "run-1").absolute(), (keep / "run-2").absolute()}
    assert (keep / "run-1" / "studies.db").read_bytes() == b"first run's studies"
    err = capsys.readouterr().err
    assert f"are in {(keep / 'run-2').absolute()}" in err
    plans = [gpu_check.plan_steps(folder) for folder in sorted(workdirs)]
    storages = [[s.args[s.args.index("--storage") + 1] for s in steps if "--storage" in s.args] for steps in plans]
    assert storages[0] and not set(storages[0]) & set(storages[1])


def test_a_keep_that_cannot_be_read_is_exit_2_naming_why(tmp_path):
    done = subprocess.run([sys.executable, str(_SCRIPT), "--keep", str(tmp_path / ("k" * 300)), "--dry-run"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--keep" in done.stderr and "File name too long" in done.stderr


def test_a_keep_folder_that_cannot_be_made_when_the_run_starts_is_exit_2(tmp_path, capsys):
    keep = tmp_path / "kept"
    args = gpu_check.parse_args(["--keep", str(keep)])
    keep.write_text("made after the arguments were read\n")  # a file took the folder's place before the run started
    assert gpu_check.run(args, _fake_gpu_host(set()), cuda_absent=lambda: None) == 2
    err = capsys.readouterr().err
    assert "--keep" in err and "cannot make a folder for this run there (File exists)" in err
    assert "nothing was run" in err and "Traceback" not in err
    assert keep.read_text() == "made after the arguments were read\n"
