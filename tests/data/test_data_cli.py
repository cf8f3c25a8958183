"""`torchpace shard` and `torchpace bench-data` in real subprocesses: help without torch, JSON, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from data_helpers import snapshot


@pytest.mark.parametrize("verb", ["shard", "bench-data"])
def test_help_does_not_import_torch(verb):
    code = ("import sys; from torchpace.cli import main; code = main([%r, '--help']); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(code)" % verb)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip().endswith("NO-TORCH"), result.stdout + result.stderr


def test_verbs_are_listed(cli_run):
    result = cli_run("--help")
    assert "shard" in result.stdout and "bench-data" in result.stdout


def test_shard_writes_verifies_and_reports(cli_run, folder, tmp_path):
    before = snapshot(folder)
    result = cli_run("shard", str(folder), "--out", str(tmp_path / "out"), "--shard-size", "10", "--shuffle", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["samples"] == 24 and [s["samples"] for s in payload["shards"]] == [10, 10, 4] and payload["shuffled"]
    assert snapshot(folder) == before
    text = cli_run("shard", str(folder), "--out", str(tmp_path / "out2"))
    assert text.returncode == 0 and "wrote 24 samples" in text.stdout and "verified" in text.stdout


@pytest.mark.parametrize("args, message", [
    (["{empty}", "--out", "{tmp}/o"], "has no class sub-folders"),
    (["{folder}", "--out", "{folder}/class_0/o"], "inside the source folder"),
    (["{folder}", "--out", "{tmp}/o", "--shard-size", "0"], "1<=x<=1048576"),
])
def test_shard_bad_input_exits_2(cli_run, folder, tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    argv = [a.format(empty=tmp_path / "empty", tmp=tmp_path, folder=folder) for a in args]
    result = cli_run("shard", *argv)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_bench_data_json(cli_run, folder, tmp_path):
    result = cli_run("bench-data", str(folder), "--decoder", "pillow", "--num-workers", "0", "--max-time", "0.2",
                     "--batch-size", "4", "--shards", "none", "--json", "--out", str(tmp_path / "r.json"))
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["kind"] == "torchpace.bench-data" and payload["files"] == 24 and payload["shards"] == 0
    assert json.loads((tmp_path / "r.json").read_text())["rates"] == payload["rates"]


def test_bench_data_text_names_the_cold_method(cli_run, folder):
    result = cli_run("bench-data", str(folder), "--decoder", "pillow", "--num-workers", "0", "--max-time", "0.2",
                     "--batch-size", "4")
    assert result.returncode == 0, result.stderr
    assert "posix_fadvise(POSIX_FADV_DONTNEED)" in result.stdout and "decode" in result.stdout


def test_bench_data_on_a_missing_folder_exits_2(cli_run, tmp_path):
    result = cli_run("bench-data", str(tmp_path / "nope"))
    assert result.returncode == 2 and "is not a folder" in result.stderr
