"""`torchpace doctor` end to end on this real host: real subprocesses, real limits, real torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jsonschema
import pytest

from torchpace.doctor.schema import DOCTOR_JSON_SCHEMA

# Variables the tests set themselves; dropped from the inherited env so each run starts clean.
_CONTROLLED = ("CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF",
               "PYTORCH_ALLOC_CONF")
_TIMEOUT_S = 120


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CONTROLLED}
    env.update(extra)
    return env


def _doctor(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    argv = [*prefix, sys.executable, "-m", "torchpace", "doctor", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env or _env(), timeout=_TIMEOUT_S)


def _report(proc: subprocess.CompletedProcess) -> dict:
    report = json.loads(proc.stdout)
    jsonschema.validate(report, DOCTOR_JSON_SCHEMA, cls=jsonschema.Draft202012Validator)
    assert proc.returncode == report["exit_code"], proc.stderr
    return report


def _by_id(report: dict) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for finding in report["findings"]:
        found.setdefault(finding["id"], []).append(finding)
    return found


def test_json_on_this_host(tmp_path):
    report = _report(_doctor("--json", "--data-dir", str(tmp_path)))
    found = _by_id(report)
    assert found["torch.install"][0]["severity"] == "ok"
    assert found["smoke.dataloader"][0]["severity"] == "ok", found["smoke.dataloader"]
    assert found["storage.data_dir"][0]["data"]["path"] == str(tmp_path)
    assert found["torch.cuda_launch_blocking"][0]["severity"] == "ok"
    assert found["cpu.threads"][0]["severity"] == "ok"
    assert report["host"]["usable_cores"] == len(os.sched_getaffinity(0))
    assert {f["area"] for f in report["findings"]} >= {"torch", "gpu", "cpu", "memory", "limits", "storage",
                                                        "allocator", "smoke"}
    for finding in report["findings"]:
        if finding["severity"] == "fail":
            assert finding["remedy"], finding  # every failure says what to do


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_misconfigured_run_flags_each_problem():
    """prlimit --nofile=256, CUDA_LAUNCH_BLOCKING=1 and OMP_NUM_THREADS above the usable cores."""
    threads = max(64, 2 * len(os.sched_getaffinity(0)))
    env = _env(CUDA_LAUNCH_BLOCKING="1", OMP_NUM_THREADS=str(threads))
    proc = _doctor("--json", env=env, prefix=("prlimit", "--nofile=256"))
    report = _report(proc)
    assert proc.returncode == 1
    found = _by_id(report)
    [nofile] = found["limits.nofile"]
    assert nofile["severity"] == "fail" and nofile["data"]["soft"] == 256 and nofile["data"]["hard"] == 256
    [blocking] = found["torch.cuda_launch_blocking"]
    assert blocking["severity"] == "warn" and blocking["remedy"]["command"] == "unset CUDA_LAUNCH_BLOCKING"
    [omp] = [f for f in found["cpu.threads"] if f["data"].get("variable") == "OMP_NUM_THREADS"]
    assert omp["severity"] == "warn" and omp["data"]["threads"] == threads
    assert found["smoke.dataloader"][0]["severity"] == "ok"  # two workers still fit in 256 fds


def test_strict_turns_warnings_into_failure():
    env = _env(OMP_NUM_THREADS=str(4 * len(os.sched_getaffinity(0)) + 1))
    relaxed = _report(_doctor("--json", env=env))
    strict = _report(_doctor("--json", "--strict", env=env))
    assert relaxed["summary"]["warn"] >= 1 and strict["strict"] is True
    assert strict["exit_code"] == 1
    if relaxed["summary"]["fail"] == 0:
        assert relaxed["exit_code"] == 0


def test_text_output_on_this_host(tmp_path):
    proc = _doctor("--data-dir", str(tmp_path))
    assert proc.returncode in (0, 1), proc.stderr
    for heading in ("PyTorch build", "GPUs", "CPU", "Memory", "Limits", "Storage", "Allocator", "Smoke tests"):
        assert f"\n{heading}\n" in proc.stdout
    assert "Summary:" in proc.stdout and f"exit {proc.returncode}" in proc.stdout


@pytest.mark.parametrize("make_bad", [lambda p: p / "missing", lambda p: (p / "file.txt").write_text("x") and p / "file.txt"])
def test_bad_data_dir_is_a_usage_error(tmp_path, make_bad):
    bad = make_bad(tmp_path)
    proc = _doctor("--data-dir", str(bad))
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "--data-dir" in proc.stderr
    assert proc.stdout == ""


def test_help_does_not_import_torch():
    code = ("import sys\n"
            "from torchpace.cli import main\n"
            "rc = main(['doctor', '--help'])\n"
            "assert 'torch' not in sys.modules, 'doctor --help imported torch'\n"
            "sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--data-dir" in proc.stdout and "--strict" in proc.stdout and "--json" in proc.stdout
