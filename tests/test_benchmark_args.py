"""The benchmarks' arguments (`benchmarks/_args.py`): a duration is a finite number > 0 and a count an
integer >= 1, in every benchmark; anything else is exit 2 before anything runs."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from _args import busy, count, keep_folder, minutes, new_run_folder, next_run_folder, seconds  # noqa: E402


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "0", "-2", "", "ten"])
def test_a_duration_must_be_finite_and_positive(text):
    with pytest.raises(argparse.ArgumentTypeError, match="finite number > 0"):
        seconds(text)


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "nan", ""])
def test_a_count_is_a_whole_number_of_at_least_one(text):
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1"):
        count(text)


@pytest.mark.parametrize("text", ["-1", "9", "1.5", "two", ""])
def test_busy_processes_are_a_whole_number_from_0_to_8(text):
    with pytest.raises(argparse.ArgumentTypeError, match="from 0 to 8"):
        busy(text)


def test_valid_values_pass():
    assert seconds("0.25") == 0.25 and seconds("1e3") == 1000.0 and count("3") == 3
    assert busy("0") == 0 and busy("2") == 2


@pytest.mark.parametrize("text", ["0", "-3", "60", "1e9", "nan", "inf", "nine", ""])
def test_a_time_box_is_minutes_above_0_and_below_60_and_says_minutes(text):
    with pytest.raises(argparse.ArgumentTypeError, match="minutes, a number above 0 and below 60") as err:
        minutes(text)
    assert "seconds" not in str(err.value)


def test_a_keep_folder_is_one_that_is_or_can_be_made(tmp_path):
    (tmp_path / "f").write_text("x")
    assert keep_folder(str(tmp_path)) == tmp_path and keep_folder(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    for text, said in ((str(tmp_path / "f"), "it is a file"), (str(tmp_path / "f" / "sub"), "so no folder can be made"),
                       (str(tmp_path / ("n" * 300)), "File name too long"), ("  ", "name a folder")):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            keep_folder(text)


def test_each_kept_run_gets_a_new_folder_and_an_earlier_ones_is_left(tmp_path):
    keep = tmp_path / "kept"
    assert next_run_folder(keep) == keep / "run-1" and not keep.exists()
    first = new_run_folder(keep)
    (first / "studies.db").write_text("first")
    (keep / "run-2").mkdir()  # another run beside it took the next name
    assert next_run_folder(keep) == keep / "run-3" == new_run_folder(keep)
    assert (first / "studies.db").read_text() == "first"


@pytest.mark.parametrize("script", ["gpu_check.py", "bench_speedup.py", "bench_script.py", "bench_frameworks.py", "bench_jobs.py", "bench_tune.py"])
def test_every_keep_option_refuses_a_file_with_exit_2(tmp_path, script):
    (tmp_path / "notes.txt").write_text("mine\n")
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--keep", str(tmp_path / "notes.txt")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--keep" in done.stderr and "it is a file" in done.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_no_benchmark_takes_a_bare_float_or_int():
    bare = [f"{path.name}: {line.strip()}" for path in sorted(BENCHMARKS.glob("*.py"))
            for line in path.read_text().splitlines() if re.search(r"add_argument\(.*type=(float|int)\b", line)]
    assert not bare, bare


def test_a_benchmark_refuses_nan_with_exit_2_before_running():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_monitor.py"), "--duration", "nan"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--duration" in done.stderr and "'nan' is not valid" in done.stderr
    assert "sleep child" not in done.stdout


def test_the_script_benchmarks_hook_cost_runs_on_the_probe_scripts_use():
    import bench_script  # noqa: E402  (benchmarks/ is on the path above)

    per_step_s = bench_script.hook_overhead_s(steps=200)
    assert 0.0 < per_step_s < 1.0


def test_the_measurement_benchmark_reads_a_bench_result_as_it_is_now(host):
    import bench_measurement  # noqa: E402  (benchmarks/ is on the path above)

    median, step_time_s, steps, aggregate = bench_measurement.torchpace_samples_per_s("tabular", 1.0, host)
    assert median > 0 and step_time_s > 0 and steps >= 1 and aggregate > 0
