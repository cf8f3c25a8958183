"""Real trial processes: ok, invalid, crash, nonfinite, timeout with the whole group killed."""

import dataclasses
import os
import re
import sys


from torchpace.knobs.system import GLIBC_THRESHOLDS
from torchpace.trial import TrialSpec, plan_trial, run_trial

from _support import faked_host, faked_host_env, fixture_workload


def _spec(name, **kw):
    kw.setdefault("max_time_s", 2.0)
    kw.setdefault("compute_only", False)
    return TrialSpec(workload=fixture_workload(name), **kw)


def test_ok_trial_returns_its_bench(host):
    result = run_trial(_spec("tiny_mlp", guard_steps=5), host, timeout_s=120)
    assert result.status == "ok", result.error + result.stderr_tail
    assert result.bench.throughput.samples_per_s > 0 and len(result.guard_losses) == 5


def test_a_working_trial_never_dumps_its_stacks(host):
    # faulthandler reads the frames of threads that run, which can crash a live process: a trial is
    # asked for its stacks only once it is stuck at its cap, never while it works. The cap is far above
    # the trial's own time (an 11 s cap, from when a timer dumped at the cap less 10 s, made a loaded or
    # slow host's working trial a timeout)
    result = run_trial(_spec("tiny_mlp", max_time_s=4.0), host, timeout_s=60)
    assert result.status == "ok", result.error + result.stderr_tail
    assert "most recent call first" not in result.stderr_tail


def test_knob_that_does_not_apply_is_invalid(host):
    result = run_trial(_spec("tiny_mlp", config={"precision.amp": "fp16"}), host, timeout_s=120)
    assert result.status == "invalid" and "precision.amp" in result.error


def test_exception_in_user_code_is_a_crash_with_their_error(host):
    result = run_trial(_spec("raises_in_loss"), host, timeout_s=120)
    assert result.status == "crash" and "planted failure inside the loss" in result.error


def test_nan_under_a_precision_knob_is_nonfinite():
    # on a host (faked, for the trial too) whose CPU computes bf16, so the trial runs bf16 autocast
    result = run_trial(_spec("nan_under_bf16", config={"precision.amp": "bf16"}, guard_steps=3), faked_host("native bf16"),
                       timeout_s=120, base_env={**os.environ, **faked_host_env("native bf16")})
    assert result.status == "nonfinite"


def test_dead_worker_is_a_crash_not_a_tuner_failure(host):
    result = run_trial(_spec("crashes_with_two_workers", config={"data.num_workers": 2}), host, timeout_s=120)
    assert result.status == "crash"


def test_hang_times_out_and_leaves_no_process_behind(host, own_leftovers):
    result = run_trial(_spec("hangs", config={"data.num_workers": 1}), host, timeout_s=15)
    assert result.status == "timeout"
    assert own_leftovers("torchpace.trial") == []
    # the child dumped its threads' stacks before the cap (faulthandler's "line N in f" frames): where it
    # was stuck is in the stderr tail
    assert re.search(r"line \d+ in _run_module_as_main", result.stderr_tail), result.stderr_tail[-1000:]


def test_a_hang_after_a_process_of_the_trial_died_is_a_crash_not_a_timeout(host, own_leftovers):
    result = run_trial(_spec("worker_dies_unnoticed", config={"data.num_workers": 1}), host, timeout_s=20)
    assert result.status == "crash" and "had died" in result.error and "made no progress" in result.error
    assert own_leftovers("torchpace.trial") == []
    alive = run_trial(_spec("hangs_with_one_worker", config={"data.num_workers": 1}), host, timeout_s=20)
    assert alive.status == "timeout"  # a worker alive but stuck: slow or hung, not crashed


def test_a_worker_death_reported_but_not_acted_on_is_a_crash():
    from torchpace.protocol import classify_timeout

    swallowed = ("W1130 profiler.py:858] Unexpected error importing torch.profiler._cupti_monitor\n"
                 "RuntimeError: DataLoader worker (pid 7400) exited unexpectedly with exit code 139.\n")
    assert classify_timeout(swallowed, [])[0] == "crash"
    assert classify_timeout("Timeout (0:00:50)!\nThread 0x1 (most recent call first):", []) == ("timeout", "")


def test_process_level_knobs_go_into_the_child_env_only(host, tmp_path):
    before = dict(os.environ)
    plan = plan_trial({"threads.intra_op": 1}, host, {"PATH": "/bin"}, tmp_path / "spec.json", tmp_path / "result.json")
    fixed = {name: str(value) for name, value in GLIBC_THRESHOLDS.items()}  # the system malloc, one speed
    assert plan.env == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **fixed}
    assert plan.argv == (sys.executable, "-m", "torchpace.trial", str(tmp_path / "spec.json"), str(tmp_path / "result.json"))
    assert dict(os.environ) == before


def test_a_config_that_needs_a_missing_tool_is_an_invalid_trial(host):
    bare = dataclasses.replace(host, allocators=())
    result = run_trial(_spec("tiny_mlp", config={"system.allocator": "jemalloc"}), bare, timeout_s=120)
    assert result.status == "invalid" and "jemalloc was asked for" in result.error


def test_trial_folders_of_a_killed_tuner_are_removed_and_running_ones_kept(tmp_path):
    import subprocess

    from torchpace.trial.runner import remove_orphan_trial_dirs

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names a process that no longer runs, like a SIGKILLed tuner's
    orphan, ours, unnamed = (tmp_path / f"torchpace-trial-{gone.pid}-abc", tmp_path / f"torchpace-trial-{os.getpid()}-x",
                             tmp_path / "torchpace-trial-oldstyle")
    for folder in (orphan, ours, unnamed):
        (folder / "spec.json").parent.mkdir()
        (folder / "spec.json").write_text("{}")
    assert remove_orphan_trial_dirs(tmp_path) == [orphan]
    assert not orphan.exists() and ours.exists() and unnamed.exists()
