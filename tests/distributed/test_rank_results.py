"""Reading a failed multi-process trial (which rank failed first), and splitting global batches: pure."""

from __future__ import annotations

import json

import torch

from torchpace.host import HostFacts
from torchpace.launch.plan import LaunchFacts
from torchpace.launch.torchrun import parse_failures
from torchpace.engine.distributed import RankEnv, RankSliceBatchSampler
from torchpace.trial.ranks import read_rank_failure
from torchpace.trial.runner import plan_trial


def _torchrun_lines(**codes):
    lines = []
    for name, code in codes.items():
        rank = int(name[1:])
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        lines.append(f"torchrun: rank {rank} (local rank {rank}, pid {100 + rank}) ended with {how}\n")
    return "".join(lines)


def _recorded(tmp_path, rank, at, error, status="crash"):
    (tmp_path / f"result.rank{rank}.json").write_text(json.dumps({"status": status, "error": error, "failed_rank": rank,
                                                                  "failed_at": at}))
    (tmp_path / f"stderr.rank{rank}.txt").write_text(f"stderr of rank {rank}\n")


def test_parse_failures_reads_what_the_torchrun_wrapper_writes():
    assert parse_failures("noise\n" + _torchrun_lines(r0=-15, r1=3)) == {0: -15, 1: 3}


def test_a_rank_that_died_without_a_result_is_the_cause_not_the_ranks_that_lost_it(tmp_path):
    _recorded(tmp_path, 0, 10.0, "RuntimeError: Connection closed by peer")
    (tmp_path / "stderr.rank1.txt").write_text("Fatal Python error: Segmentation fault\n")
    result = read_rank_failure(tmp_path / "result.json", _torchrun_lines(r0=3, r1=-11), 1, 5.0)
    assert result.status == "crash" and result.failed_rank == 1
    assert result.error == "rank 1 ended without a result (signal 11)" and "Segmentation fault" in result.stderr_tail


def test_otherwise_the_earliest_recorded_failure_and_ranks_torchrun_stopped_are_not_causes(tmp_path):
    _recorded(tmp_path, 0, 12.0, "RuntimeError: Connection closed by peer")
    _recorded(tmp_path, 2, 11.0, "CUDA out of memory", status="oom")
    result = read_rank_failure(tmp_path / "result.json", _torchrun_lines(r0=3, r1=-15, r2=3), 3, 5.0)
    assert result.status == "oom" and result.failed_rank == 2
    assert result.error == "rank 2: CUDA out of memory" and result.stderr_tail == "stderr of rank 2\n"


def test_one_process_trials_run_plainly_and_several_through_the_torchrun_wrapper(tmp_path):
    host, facts = HostFacts(logical_cpus=4, usable_cores=4), LaunchFacts(python="/py", nofile_soft=None, nofile_hard=None)
    spec, result = tmp_path / "s", tmp_path / "r"
    assert plan_trial({}, host, {}, spec, result, facts).argv == ("/py", "-m", "torchpace.trial", str(spec), str(result))
    argv = plan_trial({"nproc_per_node": 2, "distributed.strategy": "ddp"}, host, {}, spec, result, facts).argv
    assert argv == ("/py", "-m", "torchpace.launch.torchrun", "--nproc-per-node=2", "--standalone",
                    "-m", "torchpace.trial", str(spec), str(result))


def test_rank_slices_of_each_global_batch_cover_it_exactly_once():
    batches = [list(range(0, 10)), list(range(10, 20))]
    slices = [list(RankSliceBatchSampler(batches, rank, 3)) for rank in range(3)]
    assert [s[0] for s in slices] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    for k, batch in enumerate(batches):
        assert sum((s[k] for s in slices), []) == batch


def test_rank_env_reads_torchrun_variables():
    assert RankEnv.from_env({}) == RankEnv() and not RankEnv.from_env({}).under_torchrun
    ranks = RankEnv.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert ranks == RankEnv(3, 4, 1, 2) and ranks.under_torchrun
    assert torch.distributed.is_available()
