"""A training job of several processes, measured unmodified as one job: ranks started by torchrun (`torchrun`,
`python -m torch.distributed.run`) or by the script itself (`torch.multiprocessing.spawn`), real processes over
gloo (scripts/ddp_job.py). Every rank's samples per wall second make the job's figure, each rank's windows
agree with its own clock, a rank that fails ends the whole job at once and is named, and no rank is left behind.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from _support import assert_windows_match_stamps
from torchpace.protocol import TrialSpec
from torchpace.trial.pair import run_pair
from torchpace.trial.schedule import SEQUENTIAL, PairOptions
from torchpace.trial.script import script_trial_spec

SCRIPTS = Path(__file__).parent / "scripts"
JOB = str(SCRIPTS / "ddp_job.py")
TORCHRUN = ["torchrun", "--nproc-per-node", "2"]

pytestmark = pytest.mark.slow


def _bench(cli_run, *command, max_time="6", expect=0, timeout=300):
    result = cli_run("bench", "--max-time", max_time, "--json", "--", *command, timeout=timeout)
    assert result.returncode == expect, result.stderr[-4000:]
    return (json.loads(result.stdout) if expect == 0 else None), result


def _none_left(pids) -> None:
    """No process of the job is left once torchpace returned (ranks, the launcher's agent)."""
    deadline = time.monotonic() + 5  # the tree is stopped before the command returns; a zombie is reaped by init
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes of the job still run: {alive}"


def test_a_torchrun_job_is_measured_as_one_job_on_every_ranks_clock(cli_run, tmp_path):
    stamps = tmp_path / "stamps"
    bench, _ = _bench(cli_run, *TORCHRUN, JOB, "--stamps", str(stamps))
    assert bench["world_size"] == 2 and bench["global_batch_size"] == 64 and bench["batch_size"] == 32
    assert [r["rank"] for r in bench["ranks"]] == [0, 1]
    # the job's samples/s is every rank's: each window holds both ranks' samples of its steps
    steps, samples = bench["window_steps_per_s"], bench["window_samples_per_s"]
    assert all(abs(s - 64 * k) <= 1e-6 * s for s, k in zip(samples, steps))
    for rank in (0, 1):  # the job's windows, by each rank's own clock over the same steps
        assert_windows_match_stamps(bench, Path(f"{stamps}.rank{rank}"))
    # both ranks trained as one model: the guard curve is the ranks' mean loss, step by step
    assert len(bench["loss_values"]) >= bench["measured_steps"]
    _none_left([r["pid"] for r in bench["ranks"]])


def test_python_m_torch_distributed_run_is_the_same_launcher(cli_run, tmp_path):
    bench, _ = _bench(cli_run, "python", "-m", "torch.distributed.run", "--nproc-per-node=2", JOB, max_time="4")
    assert bench["world_size"] == 2 and bench["script"]["command"][:3] == ["python", "-m", "torch.distributed.run"]


def test_ranks_the_script_spawns_itself_are_one_job(cli_run, tmp_path):
    stamps = tmp_path / "stamps"
    bench, _ = _bench(cli_run, "python", JOB, "--spawn", "2", "--stamps", str(stamps))
    assert bench["world_size"] == 2 and len(bench["ranks"]) == 2 and bench["global_batch_size"] == 64
    assert_windows_match_stamps(bench, Path(f"{stamps}.rank1"))
    _none_left([r["pid"] for r in bench["ranks"]])


def test_a_straggler_is_named(cli_run, tmp_path):
    # rank 1 waits 20 ms more at each step, in its DataLoader loop: every rank then waits for it at the
    # all-reduce, and its own clock shows the time it spends outside the collective is the longer one
    bench, _ = _bench(cli_run, *TORCHRUN, JOB, "--fail", "1:0:slow", "--sleep", "0", max_time="6")
    assert bench["straggler"] is not None and bench["straggler"]["rank"] == 1, bench["ranks"]


@pytest.mark.parametrize("how, says", [
    ("raise", "rank 1 of `torchrun --nproc-per-node 2"),
    ("kill", "rank 1 (pid"),
])
def test_a_rank_that_fails_ends_the_job_at_once_named(cli_run, tmp_path, how, says):
    start = time.monotonic()
    _, result = _bench(cli_run, *TORCHRUN, JOB, "--fail", f"1:30:{how}", max_time="60", expect=1)
    assert says in result.stderr, result.stderr[-3000:]
    if how == "raise":
        assert "broke on purpose" in result.stderr
    else:
        assert "signal 9" in result.stderr
    assert time.monotonic() - start < 60, "the job was waited for, not ended when its rank failed"


def test_a_rank_that_hangs_ends_the_job_within_the_stall_bound(cli_run, tmp_path):
    start = time.monotonic()
    _, result = _bench(cli_run, *TORCHRUN, JOB, "--fail", "1:5:hang", max_time="4", expect=1)
    assert "no step for" in result.stderr, result.stderr[-3000:]
    assert time.monotonic() - start < 120


def test_launched_ranks_without_a_process_group_are_refused(cli_run, tmp_path):
    _, result = _bench(cli_run, *TORCHRUN, JOB, "--no-group", max_time="4", expect=2)
    assert "without a torch.distributed process group" in result.stderr


def test_a_job_cannot_take_turns_and_is_compared_in_separate_runs(tmp_path, host):
    # the ranks are the script's own (--spawn): nothing says so before it runs, so the comparison starts in
    # turns, the job's rank 0 says it is a job, and the comparison goes on in separate runs, named
    command = [sys.executable, JOB, "--spawn", "2"]
    spec_a, spec_b = (script_trial_spec(command, config, 2.0) for config in (_config({}), _config({"threads.intra_op": 1})))
    assert spec_a.script_ranks is None
    pair = run_pair(spec_a, spec_b, host, timeout_s=400, options=PairOptions(rounds_s=2.0, sequential_rounds=1),
                    workdir=tmp_path)
    assert pair.mode == SEQUENTIAL and "2 ranks" in pair.mode_reason, (pair.mode, pair.mode_reason, pair.a.error)
    assert pair.a.ok and pair.b.ok and pair.a.bench.step.world_size == 2


def test_a_launcher_job_compares_in_separate_runs_from_the_start():
    spec = script_trial_spec([*TORCHRUN, JOB], _config({}), 2.0)
    assert spec.script_ranks == 2
    from torchpace.trial.schedule import sequential_reason

    assert "2 ranks" in sequential_reason(spec, spec)


def _config(values):
    from torchpace.config import RunConfig

    return RunConfig(values)


def test_trial_spec_round_trips_its_ranks(tmp_path):
    spec = TrialSpec(workload="w", script_ranks=4)
    spec.save(tmp_path / "spec.json")
    assert TrialSpec.load(tmp_path / "spec.json").script_ranks == 4
