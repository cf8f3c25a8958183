"""Paired comparisons with real trial processes: the arms take turns (workers included), a failing arm
ends both, and nothing of either arm outlives the comparison, even when its parent is SIGKILLed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil

import pytest

from _support import FIXTURES, still_running, trial_snapshot
from fixtures.pair_workloads import MEMORY_LOCK_ENV
from torchpace.host import probe_host
from torchpace.measure.bench import BenchOptions
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI
from torchpace.measure.timing import WARMUP_SHARE
from torchpace.process import StoppedGroupGuard
from torchpace.trial.pair import (ALTERNATING, PARTNER, SEQUENTIAL, KeptArms, PairOptions, run_pair,
                                  separate_run_spec, sequential_reason)
from torchpace.protocol import TrialResult, TrialSpec

PAIR_WORKLOADS = FIXTURES / "pair_workloads.py"
SCRIPTS = Path(__file__).parents[1] / "script" / "scripts"
WORKERS = {"data.num_workers": 1}


def _spec(name: str, config: dict | None = None, max_time_s: float = 4.0, **fields) -> TrialSpec:
    return TrialSpec(workload=f"{PAIR_WORKLOADS}:{name}", config=dict(config or {}), max_time_s=max_time_s, **fields)


@pytest.mark.slow
def test_the_arms_take_turns_workers_included(tmp_path):
    log = tmp_path / "activity.log"
    rounds_at: list[int] = []
    env = {**os.environ, "TORCHPACE_TEST_ACTIVITY_LOG": str(log)}
    result = run_pair(_spec("logged", WORKERS), _spec("logged", WORKERS), probe_host(), timeout_s=180,
                      options=PairOptions(rounds_s=120.0, min_rounds=8, max_rounds=8, target_ci_rel=0.0), base_env=env,
                      on_round=lambda n, summary: rounds_at.append(time.monotonic_ns()))
    assert result.mode == ALTERNATING and result.ok, (result.a.error, result.b.error)
    # eight rounds whatever the host's speed: the time allowed is far beyond them, the CI target unreachable
    assert result.stopped_by == "rounds" and len(result.ratios) == 8
    assert result.a.bench.throughput.stopped_by == result.b.bench.throughput.stopped_by == "pair"
    lines = [line.split() for line in log.read_text().splitlines()]
    events = sorted((int(ns), pgid, pid) for ns, pgid, pid in lines if rounds_at[0] < int(ns) < rounds_at[-1])
    groups = {pgid for _, pgid, _ in events}
    assert len(groups) == 2  # both arms ran between the first and the last round
    for group in groups:  # main process (the group's leader) and its DataLoader workers logged in the turns
        pids = {pid for _, pgid, pid in events if pgid == group}
        assert group in pids and len(pids) >= 2
    switches = sum(1 for before, after in zip(events, events[1:]) if before[1] != after[1])
    turns = 3 * (len(rounds_at) - 1)  # three turns to a round
    # taking turns, activity switches arm only at turn boundaries; running together, it would switch
    # at nearly every one of the hundreds of logged events
    assert switches <= turns, (switches, turns, len(events))
    assert len(events) > 10 * turns


@pytest.mark.slow
def test_a_comparison_for_a_decision_stops_once_its_ci_is_clear_of_the_threshold():
    # four workers deliver about four times as fast as one: the CI clears 1.01 within the first rounds,
    # long before the time allowed (and the CI target, set unreachable)
    result = run_pair(_spec("sleepy_loader", {"data.num_workers": 1}), _spec("sleepy_loader", {"data.num_workers": 4}),
                      probe_host(), timeout_s=300, options=PairOptions(rounds_s=120.0, target_ci_rel=0.0, decide_at=1.01))
    assert result.ok and result.stopped_by == "clear", (result.stopped_by, result.ratios)
    assert len(result.ratios) >= 6 and result.summary.ci_low > 1.01


@pytest.mark.slow
def test_a_failing_arm_ends_the_comparison_and_the_other_is_not_judged():
    result = run_pair(_spec("fails_in_worker"), _spec("fails_in_worker", WORKERS), probe_host(), timeout_s=180,
                      options=PairOptions(rounds_s=3.0))
    assert result.stopped_by == "failed" and not result.ok
    assert result.b.status == "crash" and "planted failure" in result.b.error
    assert result.a.status == PARTNER and "not judged" in result.a.error


_DRIVER = """
import sys
from torchpace.host import probe_host
from torchpace.trial.pair import PairOptions, run_pair
from torchpace.protocol import TrialSpec

spec = TrialSpec(workload=sys.argv[1], config={"data.num_workers": 1}, max_time_s=4.0)
result = run_pair(spec, spec, probe_host(), timeout_s=300,
                  options=PairOptions(rounds_s=120, target_ci_rel=0.0),
                  on_round=lambda n, summary: print("round", n, flush=True))
print("ended:", result.stopped_by, [(arm.status, arm.error, arm.stderr_tail[-1500:]) for arm in (result.a, result.b)],
      flush=True)
"""


@pytest.mark.slow
def test_sigkill_of_the_parent_leaves_no_stopped_arm(tmp_path):
    driver = _start_driver(_DRIVER, tmp_path)
    try:
        first = driver.stdout.readline()
        assert first.startswith("round"), f"the comparison never reached its rounds: {first}"
        # the running arm's DataLoader worker exits at each epoch's end and the next epoch forks another, and
        # at a turn's change an arm that reported its window stops itself a moment later: look again until
        # the snapshot catches both arms with their worker and one arm stopped, waiting its turn
        for _ in range(100):
            arms, workers, stopped = trial_snapshot(driver.pid)
            if len(arms) == 2 and len(workers) >= 2 and stopped:
                break
            time.sleep(0.1)
        assert len(arms) == 2 and len(workers) >= 2 and stopped
        _kill_and_check_nothing_is_left(driver, arms + workers)
    finally:
        driver.kill()
        driver.wait()


def _start_driver(source: str, tmp_path: Path) -> subprocess.Popen:
    """A parent process running `source` on the `logged` pair workload, its trial folders under `tmp_path`."""
    return subprocess.Popen([sys.executable, "-c", source, f"{PAIR_WORKLOADS}:logged"], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "TMPDIR": str(tmp_path)})


def _kill_and_check_nothing_is_left(driver: subprocess.Popen, processes) -> None:
    driver.kill()
    driver.wait()
    left = still_running([p.pid for p in processes], 15.0)
    assert not left, f"still running after the parent's SIGKILL: {left}"


@pytest.mark.slow
def test_a_script_takes_turns_from_inside_its_process():
    command = [sys.executable, str(SCRIPTS / "loader_adamw.py"), "--epochs", "1000"]
    spec = TrialSpec(workload=" ".join(command), command=command, config={}, max_time_s=4.0)
    result = run_pair(spec, spec, probe_host(), timeout_s=180, options=PairOptions(rounds_s=3.0))
    assert result.mode == ALTERNATING and result.ok, (result.a.error, result.b.error, result.b.stderr_tail[-2000:])
    assert len(result.ratios) >= 1 and result.a.bench.throughput.stopped_by == "pair"
    assert result.b.bench.script.steps_seen > result.b.bench.throughput.measured_steps


@pytest.mark.slow
def test_a_sequential_comparison_alternates_separate_runs():
    result = run_pair(_spec("logged", max_time_s=2.0), _spec("logged", WORKERS, max_time_s=2.0), probe_host(), timeout_s=240,
                      options=PairOptions(sequential_rounds=2), sequential="testing the fallback")
    assert result.mode == SEQUENTIAL and result.mode_reason == "testing the fallback" and result.ok
    assert len(result.ratios) == 2 and result.stopped_by == "rounds" and len(result.a_rates) == 3
    assert result.b.bench.throughput.stopped_by != "pair"


def test_separate_runs_give_the_rounds_a_ci_needs_each_run_measuring_its_share():
    options = PairOptions(rounds_s=12.0)
    assert options.sequential_rounds == MIN_WINDOWS_FOR_CI and options.separate_runs == 3 * MIN_WINDOWS_FOR_CI
    assert options.run_time_s(12.0) == pytest.approx(2.0) and options.separate_runs_timeout_s is None
    assert replace(options, run_timeout_s=10.0).separate_runs_timeout_s == 3 * MIN_WINDOWS_FOR_CI * 10.0
    # each run measures its share, after a warm-up that may take as long as the whole arm's would
    run = separate_run_spec(_spec("logged", max_time_s=12.0), options)
    assert run.max_time_s == pytest.approx(2.0) and run.warmup_s == pytest.approx(WARMUP_SHARE * 12.0)
    bench = BenchOptions(max_time_s=run.max_time_s, warmup_s=run.warmup_s)
    assert bench.warmup_extra_s() == pytest.approx(WARMUP_SHARE * 12.0 - WARMUP_SHARE * 2.0)
    assert BenchOptions(max_time_s=2.0).warmup_extra_s() == 0.0 == BenchOptions(max_time_s=2.0, warmup_s=0.1).warmup_extra_s()


@pytest.mark.slow
def test_a_separate_run_that_hangs_is_ended_at_its_own_cap_not_the_comparisons():
    # the hanging arm runs first: whether the other arm's run would fit in 10 s depends on the host's load (beside
    # a dozen busy processes on 2 cores its start-up alone did not), which is not what this test is about
    hangs = TrialSpec(workload=f"{FIXTURES / 'workloads.py'}:hangs", config={}, max_time_s=2.0)
    started = time.monotonic()
    result = run_pair(hangs, _spec("logged", max_time_s=2.0), probe_host(), timeout_s=900,
                      options=PairOptions(sequential_rounds=1, run_timeout_s=10), sequential="testing the fallback")
    assert result.mode == SEQUENTIAL and result.a.status == "timeout" and result.b.status == PARTNER
    assert time.monotonic() - started < 120  # its own cap (10 s), not a third of the comparison's 900 s


@pytest.mark.slow
def test_arms_out_of_memory_held_together_go_on_in_separate_runs_under_a_cap_of_their_own(tmp_path, caplog):
    # room for one process on the "device": whichever arm loads second runs out of memory at its first step
    env = {**os.environ, MEMORY_LOCK_ENV: str(tmp_path / "device.lock")}
    one = _spec("memory_for_one", max_time_s=1.2)
    with caplog.at_level(logging.INFO, logger="torchpace.trial.pair"):
        result = run_pair(one, one, probe_host(), timeout_s=90, base_env=env,
                          options=PairOptions(rounds_s=1.2, sequential_rounds=2, run_timeout_s=60.0))
    assert result.mode == SEQUENTIAL and "out of memory" in result.mode_reason
    assert result.ok and len(result.ratios) == 2, (result.a.status, result.a.error, result.b.status, result.b.error)
    # the runs' own caps (6 runs of 60 s), not the 90 s left of a cap sized for two processes in turns: on a GPU
    # host each run starts CUDA (10-14 s a run on an H200 host), and 18 runs would have run past it
    assert any(r.getMessage().startswith("comparing in 6 separate runs, 360 s at most") for r in caplog.records)


@pytest.mark.slow
def test_under_the_latency_objective_the_turns_time_batch1_calls_and_the_throughput_comes_after_them():
    """An inference workload compared for latency: both arms held at once, each turn figured at its median
    batch-1 call (1 / p50); the arms' percentiles are those of their turns' calls, and each measures its
    throughput alone once the turns are over (the figures themselves depend on the host's load: not asserted)."""
    def spec(config):
        return TrialSpec(workload="inference", config=config, max_time_s=6.0, objective="latency")

    result = run_pair(spec({}), spec({"threads.intra_op": 1}), probe_host(), timeout_s=120,
                      options=PairOptions(rounds_s=6.0, min_rounds=MIN_WINDOWS_FOR_CI, max_rounds=8, target_ci_rel=0.0))
    assert result.mode == ALTERNATING and result.mode_reason is None and result.ok, (result.a.error, result.b.error)
    # the rounds end at 8, or when their 6 s are spent, whichever comes first: which one depends on the host's
    # load (on 2 cores beside 5 busy processes the time did), so only what holds either way is asserted
    rounds = len(result.ratios)
    assert result.stopped_by in ("rounds", "time") and 1 <= rounds <= 8
    assert (result.stopped_by == "rounds") == (rounds == 8)
    for arm, rates in ((result.a, result.a_rates), (result.b, result.b_rates)):
        latency, throughput = arm.bench.latency, arm.bench.throughput
        assert latency.stopped_by == "pair" and latency.calls >= len(rates)
        assert min(rates) <= 1 / latency.p50_s <= max(rates)  # the turns' medians bracket the median of all calls
        assert throughput.stopped_by in ("ci", "time") and throughput.samples_per_s > 0  # measured after, alone
    assert len(result.a_rates) + len(result.b_rates) == 3 * rounds  # three turns to each round, checked at its end


def test_arms_that_cannot_be_held_together_are_compared_in_separate_runs():
    one = _spec("logged")
    assert sequential_reason(one, one) is None
    assert "2 processes" in sequential_reason(one, _spec("logged", {"nproc_per_node": 2}))
    assert sequential_reason(_spec("logged", objective="latency"), one) is None  # its turns time batch-1 calls
    assert "profiled" in sequential_reason(_spec("logged", profile=True), one)
    assert "would not fit" in sequential_reason(one, one, peak_bytes=6 * 2**30, available_bytes=10 * 2**30)
    assert sequential_reason(one, one, peak_bytes=2 * 2**30, available_bytes=10 * 2**30) is None
    # one arm kept from an earlier comparison: only the other one needs the memory free
    assert sequential_reason(one, one, peak_bytes=6 * 2**30, available_bytes=10 * 2**30, new_processes=1) is None


def test_every_three_turns_are_a_round_whose_middle_turn_is_compared_with_the_two_around_it():
    from torchpace.trial.pair import paired_ratios

    # the host drifts linearly (100, 105, 110, ... per turn, A B A B ...) and B is always 1.5x A at its moment
    moment = [100.0 + 5 * turn for turn in range(9)]
    a, b = moment[0::2], [1.5 * rate for rate in moment[1::2]]
    assert paired_ratios(a, b) == pytest.approx([1.5, 1.5, 1.5])  # A B A, B A B, A B A: the drift cancels in each
    assert paired_ratios(a[:4], b) == pytest.approx([1.5, 1.5])  # 8 turns: the last two wait for a third
    assert paired_ratios(a[:3], b[:2]) == pytest.approx([1.5])
    assert paired_ratios([100.0], [150.0]) == []


def test_one_turn_many_times_slower_moves_one_round_whichever_arm_it_fell_to():
    from torchpace.trial.pair import paired_ratios

    # an A/A comparison on a host that now and then stalls a turn 20x (another process took the core)
    for slow_turn in range(12):
        turns = [1000.0] * 12
        turns[slow_turn] = 50.0
        a, b = turns[0::2], turns[1::2]
        ratios = paired_ratios(a, b)
        assert len(ratios) == 4  # each turn serves one round
        above, below = sum(r > 1 for r in ratios), sum(r < 1 for r in ratios)
        # a slow A turn pushes one round above 1 and a slow B turn one below, whether it is a round's middle or frame
        assert (above, below) == ((1, 0) if slow_turn % 2 == 0 else (0, 1)), (slow_turn, ratios)
    assert paired_ratios([1000.0] * 6, [1000.0] * 6) == [1.0] * 4


def test_a_turn_of_no_samples_leaves_its_round_out():
    from torchpace.trial.pair import paired_ratios

    # turns 100 150 100 | 0 100 150: the second round holds a turn that measured nothing (B's), so does
    # the first of 100 150 0 | 150 100 150 (A's)
    assert paired_ratios([100.0, 100.0, 100.0], [150.0, 0.0, 150.0]) == pytest.approx([1.5])
    assert paired_ratios([100.0, 0.0, 100.0], [150.0, 150.0, 150.0]) == pytest.approx([1.5])


def test_a_config_that_cannot_run_here_is_that_arms_invalid_and_nothing_starts(tmp_path):
    from dataclasses import replace

    host = replace(probe_host(), numactl=None)  # a host without numactl: system.numa=bind cannot run
    result = run_pair(_spec("logged"), _spec("logged", {"system.numa": "bind"}), host, timeout_s=60, workdir=tmp_path)
    assert result.b.status == "invalid" and "numactl" in result.b.error
    assert result.a.status == PARTNER and not result.ok and result.ratios == []


class _RecordedArm:
    """Stands in for `_Arm` at the end of a comparison: records when it is told to end and waited for."""

    def __init__(self, name: str, log: list, events: list[dict], tmp_path: Path):
        self.name, self.log, self.events = name, log, events
        self.spec = _spec("logged")
        self.result_path, self.err_path = tmp_path / f"{name}.json", tmp_path / f"{name}.err"
        self.err_path.write_text("")
        arm = self

        class _Proc:
            def poll(self):
                return None

            def wait(self, timeout=None):
                arm.log.append(("waited", arm.name))
                return 1

        self.proc = _Proc()

    def resume(self, command: str) -> None:
        self.log.append((command, self.name))


@pytest.mark.parametrize("alone_after, expected", [
    (False, [("end", "a"), ("end", "b"), ("waited", "a"), ("waited", "b")]),
    (True, [("end", "a"), ("waited", "a"), ("end", "b"), ("waited", "b")]),
])
def test_arms_end_at_once_unless_one_measures_after_its_windows(tmp_path, alone_after, expected):
    from torchpace.trial.pair import _arm_results

    log: list = []
    ready = [{"event": "ready", **({"alone_after": True} if alone_after else {})}]
    arms = [_RecordedArm("a", log, [{"event": "loaded"}], tmp_path), _RecordedArm("b", log, ready, tmp_path)]
    _arm_results(arms, None, time.monotonic() + 5, 5.0)
    assert log == expected


@pytest.mark.parametrize("max_rounds, stopped_by", [(None, ""), (60, "rounds")])
def test_only_the_time_ends_rounds_whose_ci_stays_wide_unless_a_cap_is_asked_for(max_rounds, stopped_by):
    from torchpace.trial.pair import _Rounds

    rounds = _Rounds([], PairOptions(rounds_s=600.0, max_rounds=max_rounds), on_round=None)
    # 100 rounds whose ratios spread from 0.5 to 1.5: the CI stays far wider than the target
    rounds.rates = {"a": [100.0] * 101, "b": [50.0 + (37 * i) % 100 for i in range(100)]}
    assert rounds._done(time.monotonic() + 600) == bool(stopped_by) and rounds.stopped_by == stopped_by
    assert rounds._done(time.monotonic() - 1) and rounds.stopped_by == (stopped_by or "time")


class _ReportingArm(_RecordedArm):
    """Stands in for an `_Arm` that can be kept: its report comes out with `status`."""

    keepable = measured = True

    def __init__(self, name: str, log: list, tmp_path: Path, status: str):
        super().__init__(name, log, [{"event": "window", "keepable": True}], tmp_path)
        self.status, self.kept = status, False

    def report(self, deadline: float) -> TrialResult:
        self.log.append(("report", self.name))
        return TrialResult(self.status)


def test_an_arm_whose_report_failed_is_not_kept(tmp_path):
    from torchpace.trial.pair import _arm_results

    log: list = []
    arms = [_ReportingArm("a", log, tmp_path, "ok"), _ReportingArm("b", log, tmp_path, "nonfinite")]
    kept_arms = KeptArms()
    _, results = _arm_results(arms, None, time.monotonic() + 5, 5.0, kept_arms)
    assert [r.status for r in results] == ["ok", "nonfinite"] and log == [("report", "a"), ("report", "b")]
    assert arms[0].kept and not arms[1].kept  # a loss gone NaN: that process is not measured again


def test_every_turn_of_a_comparison_lasts_one_time_the_window_a_bench_of_its_rounds_would_measure_at_most_half_a_second():
    from torchpace.measure.bench import BenchOptions

    for rounds_s in (8.0, 16.0):  # tune's trial times
        assert PairOptions(rounds_s=rounds_s).turn_s == BenchOptions(max_time_s=rounds_s).timing().window_s
    # compare's default and a long compare: a bench's window would be 0.75 s and 1 s
    assert (PairOptions(rounds_s=8.0).turn_s, PairOptions(rounds_s=30.0).turn_s, PairOptions(rounds_s=300.0).turn_s) == \
        (0.2, 0.5, 0.5)
    assert PairOptions(rounds_s=8.0, turn_length_s=0.35).turn_s == 0.35


def test_tune_pairs_spend_the_warm_ups_out_of_the_trial_time_but_keep_half_for_the_rounds():
    from torchpace.trial.pair import rounds_time

    assert rounds_time(PairOptions(rounds_s=8.0), warmups_s=3.0) == 8.0  # compare: the rounds get all of it
    spent = PairOptions(rounds_s=8.0, warmups_count=True)
    assert rounds_time(spent, warmups_s=3.0) == 5.0
    assert rounds_time(spent, warmups_s=30.0) == 4.0  # a compile warm-up longer than the trial time


_SHORT = PairOptions(rounds_s=30.0, min_rounds=3, max_rounds=3, target_ci_rel=0.0)


@pytest.mark.slow
def test_a_keeper_takes_an_arm_back_for_the_next_comparison_and_ends_every_arm_at_last(tmp_path):
    host, incumbent, candidate = probe_host(), {"data.num_workers": 1}, {"data.num_workers": 2}
    with KeptArms(capacity=2) as kept_arms:  # no arm kept beyond the comparison's two
        first = run_pair(_spec("logged"), _spec("logged", incumbent, guard_steps=2), host, 180, _SHORT, kept_arms=kept_arms,
                         workdir=tmp_path)
        assert first.ok and first.reused == (), (first.a.error, first.b.error)
        assert len(first.b.guard_losses) == 2 and len(kept_arms.pids) == 2
        held = kept_arms.pids
        # the candidate kept becomes the reference (it needs no guard steps); the defaults are not asked for
        second = run_pair(_spec("logged", incumbent), _spec("logged", candidate, guard_steps=2), host, 180, _SHORT,
                          kept_arms=kept_arms, workdir=tmp_path)
        assert second.ok and second.reused == ("a",), (second.a.error, second.b.error)
        assert held[1] in kept_arms.pids and held[0] not in kept_arms.pids and not psutil.pid_exists(held[0])
        # each report holds that comparison's turns only, and the guard steps the process ran when it started
        assert second.a.bench.throughput.windows == len(second.a_rates) == 5  # 3 rounds: A B A B A B A B A
        assert second.a.guard_losses == first.b.guard_losses
        # the same two again (a comparison repeated to confirm it): no process is started
        third = run_pair(_spec("logged", incumbent), _spec("logged", candidate, guard_steps=2), host, 180, _SHORT,
                         kept_arms=kept_arms, workdir=tmp_path)
        assert third.ok and third.reused == ("a", "b") and third.b.bench.throughput.windows == 4
        last = kept_arms.pids
        # separate runs (a config of several ranks) leave the arms kept stopped for the comparisons after them
        separate = run_pair(_spec("logged", max_time_s=1.0), _spec("logged", WORKERS, max_time_s=1.0), host, 180,
                            PairOptions(sequential_rounds=1), sequential="testing the fallback", kept_arms=kept_arms,
                            workdir=tmp_path)
        assert separate.mode == SEQUENTIAL and separate.ok, (separate.a.error, separate.b.error)
        assert kept_arms.pids == last
        assert all(psutil.Process(pid).status() == psutil.STATUS_STOPPED for pid in last)
    assert still_running(last, 15.0) == [] and not list(tmp_path.glob("torchpace-trial-*"))


@pytest.mark.slow
def test_the_other_arm_of_a_failed_comparison_is_kept(tmp_path):
    with KeptArms() as kept_arms:
        result = run_pair(_spec("fails_in_worker"), _spec("fails_in_worker", WORKERS), probe_host(), 180, _SHORT,
                          kept_arms=kept_arms)
        assert result.b.status == "crash" and result.a.status == PARTNER
        assert len(kept_arms.pids) == 1  # the failed arm is gone; its partner waits for the next comparison


class _HeldArm:
    """Stands in for a kept `_Arm`: its spec, and whether it was ended."""

    def __init__(self, config: dict, guard_steps: int = 0):
        self.spec, self.kept, self.ended = replace(_spec("logged", config, guard_steps=guard_steps), gate="3,4"), True, False

    def dispose(self, guard) -> None:
        self.ended = True


def test_a_comparison_takes_the_arms_it_needs_and_the_least_recently_used_others_are_ended():
    defaults, incumbent, first, second = {}, {"data.num_workers": 1}, {"data.num_workers": 2}, {"data.num_workers": 4}
    kept_arms = KeptArms(capacity=3)
    arms = [_HeldArm(defaults), _HeldArm(incumbent, 2), _HeldArm(first, 2)]  # the least recently used first
    for arm in arms:
        kept_arms.keep(arm)
    specs = [_spec("logged", incumbent), _spec("logged", second, guard_steps=2)]
    assert kept_arms.reusable(specs) == 1
    assert kept_arms.take(specs) == [arms[1], None]
    # with the comparison's own two, three are held: the candidate before stays for its second comparison
    assert [arm.ended for arm in arms] == [True, False, False]
    # a comparison short of memory ends every arm it does not need
    assert kept_arms.keep_only([_spec("logged", incumbent), _spec("logged", second, guard_steps=2)]) == 1 and arms[2].ended


def test_an_arm_held_for_a_later_comparison_outlasts_the_capacity_but_not_a_shortage_of_memory():
    defaults, first, second = {}, {"data.num_workers": 1}, {"data.num_workers": 2}
    kept_arms = KeptArms(capacity=3)
    kept_arms.hold(_spec("logged", defaults))
    kept_arms.hold(_spec("logged", defaults, max_time_s=9.0))  # the same process: held once
    # an A/A comparison leaves two defaults processes; only one of them is held
    arms = [_HeldArm(defaults), _HeldArm(defaults), _HeldArm(first, 2), _HeldArm(second, 2)]  # least recently used first
    for arm in arms:
        kept_arms.keep(arm)
    new = [_spec("logged", {"data.num_workers": 3}), _spec("logged", {"data.num_workers": 4}, guard_steps=2)]
    assert kept_arms.take(new) == [None, None]
    # the held one is the most recently used defaults arm; of the others the capacity's one spare is the
    # most recent candidate
    assert [arm.ended for arm in arms] == [True, False, True, False]
    assert kept_arms.take([_spec("logged", defaults), _spec("logged", first, guard_steps=2)]) == [arms[1], None]
    kept_arms.keep(arms[1])
    assert kept_arms.keep_only(new) == 2 and arms[1].ended and arms[3].ended  # memory is short: held or not, ended


@pytest.mark.parametrize("exits_after_s, deadline_s, status", [(1.5, 30.0, "crash"), (30.0, 0.5, "timeout"),
                                                              ("stopped", 30.0, "timeout")])
def test_an_arm_that_stopped_taking_turns_and_still_runs_is_waited_for_until_the_deadline(tmp_path, exits_after_s,
                                                                                          deadline_s, status):
    # an arm that reported a gate and then failed instead of stopping at it (a DataLoader worker killed: the
    # loader raises, then waits up to 5 s for its other workers) is still exiting when the comparison looks:
    # its failure is a crash, not "reached no gate" after no time at all; one still running at the deadline is
    from torchpace.trial.pair import _Arm, _ended_result, _wait_stopped

    arm = _Arm("b", _spec("logged"), tmp_path)
    # (a stopped one does not end by itself: it is not waited for)
    code = ("import os, signal; os.kill(os.getpid(), signal.SIGSTOP)" if exits_after_s == "stopped"
            else f"import time; time.sleep({exits_after_s}); raise SystemExit(3)")
    arm.proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)  # its own group, as an arm's is
    if exits_after_s == "stopped":
        assert _wait_stopped(arm.proc, time.monotonic() + 30.0)
    with StoppedGroupGuard() as guard:
        try:
            result = _ended_result(arm, 60.0, time.monotonic() + deadline_s)
            assert result.status == status, result.error
            assert (arm.proc.poll() is None) == (status == "timeout")  # a timeout is told at the deadline, not after
        finally:
            guard.hold(arm.proc.pid)
            arm.dispose(guard)


def test_kept_arms_are_ended_for_memory_and_stay_stopped_through_separate_runs_that_fit_beside_them():
    from torchpace.trial.pair import hold_both_reason

    gib, defaults, incumbent, other = 2**30, {}, {"data.num_workers": 1}, {"data.num_workers": 2}
    free = {"bytes": 10 * gib}

    def held():
        kept_arms = KeptArms(capacity=4)
        arms = [_HeldArm(defaults), _HeldArm(incumbent, 2), _HeldArm(other, 2)]
        for arm in arms:
            kept_arms.keep(arm)
        return kept_arms, arms

    def available():
        return free["bytes"]

    ranks = (_spec("logged", incumbent), _spec("logged", {"nproc_per_node": 2}, guard_steps=2))
    kept_arms, arms = held()  # two ranks of 3 GiB fit in 10 GiB: every arm kept stays, stopped
    assert "2 processes" in hold_both_reason(*ranks, kept_arms, 3 * gib, available)
    assert not any(arm.ended for arm in arms)
    kept_arms, arms = held()  # two ranks of 6 GiB do not: every arm kept is ended, the incumbent's too
    assert "2 processes" in hold_both_reason(*ranks, kept_arms, 6 * gib, available) and all(arm.ended for arm in arms)
    # memory alone: the arms the comparison does not need are ended, and memory is read again
    pair = (_spec("logged", incumbent), _spec("logged", {"data.num_workers": 4}, guard_steps=2))
    kept_arms, arms = held()
    readings = iter([5 * gib, 10 * gib])
    assert hold_both_reason(*pair, kept_arms, 6 * gib, lambda: next(readings)) is None
    assert [arm.ended for arm in arms] == [True, False, True]
    kept_arms, arms = held()
    assert "would not fit" in hold_both_reason(*pair, kept_arms, 9 * gib, available)
    assert hold_both_reason(*pair, None, 3 * gib, available) is None


def test_a_config_to_be_measured_in_a_fresh_process_has_its_kept_arms_ended_whatever_guard_steps_they_ran():
    defaults, tuned = {}, {"data.num_workers": 2}
    kept_arms = KeptArms(capacity=4)
    kept_arms.hold(_spec("logged", defaults))
    arms = [_HeldArm(defaults), _HeldArm(tuned, 2), _HeldArm(tuned)]
    for arm in arms:
        kept_arms.keep(arm)
    final = [_spec("logged", defaults), _spec("logged", tuned, guard_steps=2)]
    assert kept_arms.end_serving(final[1]) == 2 and [arm.ended for arm in arms] == [False, True, True]
    assert kept_arms.reusable(final) == 1 and kept_arms.take(final) == [arms[0], None]
    assert kept_arms.end_serving(final[1]) == 0


@pytest.mark.parametrize("kept, wanted, same", [
    ({}, {"max_time_s": 9.0}, True),  # a comparison's own time cap
    ({"guard_steps": 3}, {}, True),  # a reference needs no guard steps
    ({}, {"guard_steps": 3}, False),  # a candidate needs its guard steps, which this process did not run
    ({"guard_steps": 3}, {"guard_steps": 3}, True),
    ({}, {"config": {"data.num_workers": 1}}, False),
    ({}, {"command": ["python", "train.py"]}, False),
])
def test_a_kept_arm_serves_only_the_same_process(kept, wanted, same):
    from torchpace.trial.pair import _same_process

    assert _same_process(replace(_spec("logged"), gate="3,4", **kept), replace(_spec("logged"), **wanted)) is same


_KEEPER_DRIVER = """
import sys, time
from torchpace.host import probe_host
from torchpace.trial.pair import KeptArms, PairOptions, run_pair
from torchpace.protocol import TrialSpec

spec = TrialSpec(workload=sys.argv[1], config={"data.num_workers": 1}, max_time_s=4.0)
with KeptArms() as kept_arms:
    result = run_pair(spec, spec, probe_host(), timeout_s=300, kept_arms=kept_arms,
                      options=PairOptions(rounds_s=30, min_rounds=2, max_rounds=2, target_ci_rel=0.0))
    print("kept", result.ok, *kept_arms.pids, flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_sigkill_of_the_parent_between_comparisons_leaves_no_kept_arm(tmp_path):
    driver = _start_driver(_KEEPER_DRIVER, tmp_path)
    try:
        line = driver.stdout.readline().split()
        assert line[:2] == ["kept", "True"] and len(line) == 4, line
        arms, workers, stopped = trial_snapshot(driver.pid)
        assert sorted(p.pid for p in arms) == sorted(map(int, line[2:])) and len(stopped) == 2  # both wait, stopped
        _kill_and_check_nothing_is_left(driver, arms + workers)
    finally:
        driver.kill()
        driver.wait()
