"""Real 2-process DDP and FSDP over gloo on the CPU (torchrun), against single-process training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchpace.examples.tabular import workload
from torchpace.runtime import prepare

JOB = Path(__file__).parent / "rank_job.py"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """rank_job.py run once by torchrun with 2 processes; its output folder."""
    out = tmp_path_factory.mktemp("ranks")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(JOB), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _report(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


def _single_process_grads(indices: list[int]) -> list[torch.Tensor]:
    """Gradients of one plain (single-process) step on exactly these samples."""
    single = workload()
    with prepare(single, {}) as run:
        x, y = single.dataset[indices]
        run.step_on_device((x, y))
        return [p.grad.detach().clone() for p in run.model.parameters()]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_step_on_two_ranks_gives_the_single_process_gradients_of_their_global_batch(two_ranks, strategy):
    reports = [_report(two_ranks, r)[strategy] for r in (0, 1)]
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" for r in reports)
    assert reports[0]["model"] == ("DistributedDataParallel" if strategy == "ddp" else "FSDPSequential")
    first, second = reports[0]["indices"], reports[1]["indices"]
    assert len(first) == len(second) == 256 and not set(first) & set(second)  # two disjoint shards
    expected = _single_process_grads(first + second)
    for rank in (0, 1):
        grads = torch.load(two_ranks / f"grads-{strategy}-rank{rank}.pt")
        assert len(grads) == len(expected)
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_bench_on_two_ranks_counts_both_ranks_samples_and_the_largest_peak(two_ranks):
    reports = [_report(two_ranks, r) for r in (0, 1)]
    benches = [r["bench"] for r in reports]
    for key in ("samples_per_s", "windows", "measured_steps", "step_time_s", "stopped_by", "peak_memory_bytes"):
        assert benches[0][key] == benches[1][key], key  # one collective clock: both ranks took the same decisions
    bench = benches[0]
    assert bench["world_size"] == 2 and bench["batch_size"] == 256 and bench["global_batch_size"] == 512
    # samples/s is the global batch over the (barrier to barrier) step time, not one rank's batch
    assert bench["samples_per_s"] == pytest.approx(512 / bench["step_time_s"], rel=0.35)
    largest = max(r["local_peak_bytes"] for r in reports)
    assert bench["peak_memory_bytes"] <= largest and bench["peak_memory_bytes"] >= 0.98 * largest
    assert all(r["still_initialized"] for r in reports)  # prepare() leaves the job's own group to the job


def test_a_script_under_torchrun_prepares_twice_in_one_group_and_exits_cleanly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "torchpace.launch.torchrun", "--standalone", "--nproc-per-node=2",
                           str(Path(__file__).parent / "prepare_twice.py"), str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "terminate called" not in done.stderr, done.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text().splitlines() == [
            "attempt 0 world 2 finite True", "attempt 1 world 2 finite True", "still joined True"]
