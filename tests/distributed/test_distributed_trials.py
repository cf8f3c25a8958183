"""Trials of 2 processes through torchrun: the result, and a rank that dies, raises or hangs."""

from __future__ import annotations

import json

import pytest
import torch

from torchpace.trial import TrialSpec, run_trial

from _support import fixture_workload

DDP2 = {"nproc_per_node": 2, "distributed.strategy": "ddp"}


def _spec(name: str, **kw) -> TrialSpec:
    kw.setdefault("max_time_s", 2.0)
    kw.setdefault("compute_only", False)
    return TrialSpec(workload=fixture_workload(name), config=dict(DDP2), **kw)


def test_a_two_process_trial_measures_both_ranks_and_guards_at_the_global_batch(host, own_leftovers):
    result = run_trial(_spec("tiny_mlp", guard_steps=4), host, timeout_s=180)
    assert result.status == "ok", result.error + result.stderr_tail
    assert result.bench.step.world_size == 2 and result.bench.step.global_batch_size == 64
    single = run_trial(TrialSpec(workload=fixture_workload("tiny_mlp"), max_time_s=1.0, compute_only=False, guard_steps=4),
                       host, timeout_s=120)
    # the guard splits each batch of 32 between the ranks: the same losses as one process on it
    assert result.guard_losses == pytest.approx(single.guard_losses, rel=1e-4)
    assert own_leftovers("torchpace.trial") == []


@pytest.mark.parametrize("name, error", [("dies_on_rank_one", "rank 1 ended without a result (exit status 139)"),
                                         ("raises_on_rank_one", "RuntimeError: planted failure on rank 1")])
def test_a_rank_that_fails_is_a_crash_of_that_rank_and_nothing_is_left_behind(host, own_leftovers, name, error):
    result = run_trial(_spec(name), host, timeout_s=180)
    assert result.status == "crash" and result.failed_rank == 1
    assert result.error.startswith("rank 1") and error in result.error, result.error
    # rank 1's own error and stderr, not rank 0's echo of losing its peer in the all-reduce
    assert "planted" in result.error + result.stderr_tail and "rank 0" not in result.error
    assert own_leftovers("torchpace.trial") == []


def test_a_rank_that_hangs_times_out_and_every_rank_is_killed(host, own_leftovers):
    result = run_trial(_spec("hangs_on_rank_one"), host, timeout_s=25)
    assert result.status == "timeout"
    assert "--- rank 0 ---" in result.stderr_tail and "--- rank 1 ---" in result.stderr_tail
    assert own_leftovers("torchpace.trial") == [] and own_leftovers("torch.distributed") == []


def test_bench_with_two_processes_runs_them_through_torchrun_and_reports_the_global_batch(cli_run):
    done = cli_run("bench", "tabular", "--set", "nproc_per_node=2", "--set", "distributed.strategy=ddp", "--max-time", "3",
                   "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["world_size"] == 2 and result["global_batch_size"] == 2 * result["batch_size"]
    assert result["config"] == {"nproc_per_node": 2, "distributed.strategy": "ddp"}


def test_profile_with_two_processes_runs_both_ranks_and_reports_the_communication_share(cli_run, tmp_path):
    trace = tmp_path / "trace.json.gz"
    done = cli_run("profile", "tabular", "--set", "nproc_per_node=2", "--set", "distributed.strategy=ddp", "--steps", "3",
                   "--python-steps", "0", "--trace", str(trace), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)  # rank 0 alone reports: one JSON document
    comm = next(f for f in result["findings"] if f["id"] == "profile.communication")
    assert 0 < comm["data"]["comm_frac"] < 1 and any("all_reduce" in name for name in comm["data"]["collectives"])
    assert result["verdict"]["shares"]["comm_frac"] == comm["data"]["comm_frac"] and trace.is_file()


@pytest.mark.parametrize("sets, message", [
    (["nproc_per_node=64", "distributed.strategy=ddp"], "64 is more than this host allows: at most"),
    (["nproc_per_node=2"], "nproc_per_node > 1 needs distributed.strategy = ddp or fsdp"),
    pytest.param(["distributed.strategy=ddp", "distributed.backend=nccl"], "nccl runs on CUDA GPUs",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA: nccl applies")),
])
def test_bench_refuses_what_cannot_run_here_before_starting_any_process(cli_run, sets, message):
    done = cli_run("bench", "tabular", *[part for s in sets for part in ("--set", s)], "--max-time", "1")
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_profile_refuses_more_processes_than_the_host_has_before_starting_any(cli_run):
    done = cli_run("profile", "tabular", "--set", "nproc_per_node=64", "--set", "distributed.strategy=ddp")
    assert done.returncode == 2 and "64 is more than this host allows: at most" in done.stderr, done.stderr[-2000:]
