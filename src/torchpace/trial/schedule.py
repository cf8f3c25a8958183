"""The schedule of a paired comparison, pure: how long and how precisely two configs are compared, the
rounds their turns make, when the rounds stop, and when two processes cannot take turns.

`PairOptions` says how a comparison runs, `PairResult` what it gave; `paired_ratios` makes the rounds of
turns taken A B A B ... (every three turns a round, the middle turn against the mean of the two around it),
`rounds_stop` says when the rounds are enough, `sequential_reason` when the arms must be separate runs
instead (`separate_run_spec` is one such run). The processes themselves, their gates and the arms kept
between comparisons are `torchpace.trial.arms`; `torchpace.trial.pair` runs a comparison with both.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from torchpace.knobs.distributed import nproc_of
from torchpace.measure.result import BenchResult, pool_throughput
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI, Summary, summarize
from torchpace.measure.timing import WARMUP_SHARE, window_for
from torchpace.protocol import TrialResult, TrialSpec

ALTERNATING, SEQUENTIAL = "alternating", "sequential"
TURNS_PER_ROUND = 3  # A B A, then B A B, ...: turns, or separate runs, to a round (`paired_ratios`)
PARTNER = "partner"  # an arm ended because the other arm failed: no verdict on its config
_HOLD_BOTH_SHARE = 0.8  # two arms are held at once only when twice the peak memory fits in this share
# a turn lasts at most this long: a round of three then mostly falls within one speed of a host whose speed
# switches every few seconds (beside two busy processes, 0.5 s turns gave an A/A comparison 172 rounds in
# 300 s, CI ±3.6%, where 1 s turns gave 89-93 and ±3.6-5.3%)
_MAX_TURN_S = 0.5


@dataclass(frozen=True)
class PairOptions:
    """How long and how precisely to compare.

    Attributes:
        rounds_s: wall seconds for the rounds (both arms' turns together).
        min_rounds: rounds before the CI may stop the comparison (the fewest a 95% CI needs).
        max_rounds: rounds at most (None: the time alone ends them, so a longer comparison narrows the CI).
        target_ci_rel: stop once the 95% CI of the median ratio is within this relative half-width.
        sequential_rounds: rounds of separate runs (A B A, B A B, ...: `separate_runs` runs) when the arms
            cannot take turns; by default the rounds a 95% CI needs, so that a comparison of separate runs
            can decide on its own as one in turns does (two rounds bound the median 1 time in 2).
        run_timeout_s: separate runs: each run's own cap, as a trial of its share of the time would have
            (None: an equal share of the comparison's cap); a run never outlasts the comparison's cap.
        decide_at: the ratio a decision is taken against (tune: accept above 1 + its floor): stop once
            the 95% CI lies wholly above or wholly below it, since more rounds would not change that
            decision (None: only the CI's width stops the rounds early).
        warmups_count: the arms' warm-ups are spent out of `rounds_s`, as a single trial's warm-up is out of
            its time cap (tune's trial time), but the rounds keep at least half of it; False: the rounds get
            all of `rounds_s` (compare's --max-time).
        turn_length_s: how long every turn of either arm lasts (None: the window a bench of `rounds_s` would
            measure, `measure.timing.window_for`, but at most `_MAX_TURN_S`).
    """

    rounds_s: float = 20.0
    min_rounds: int = MIN_WINDOWS_FOR_CI
    max_rounds: int | None = None
    target_ci_rel: float = 0.02
    sequential_rounds: int = MIN_WINDOWS_FOR_CI
    run_timeout_s: float | None = None
    decide_at: float | None = None
    warmups_count: bool = False
    turn_length_s: float | None = None

    @property
    def separate_runs(self) -> int:
        """The runs of a comparison of separate runs: `TURNS_PER_ROUND` to each of its rounds."""
        return TURNS_PER_ROUND * max(1, self.sequential_rounds)

    @property
    def separate_runs_timeout_s(self) -> float | None:
        """The cap of a comparison of separate runs: every run's own cap (None without `run_timeout_s`)."""
        return self.separate_runs * self.run_timeout_s if self.run_timeout_s is not None else None

    def run_time_s(self, rounds_s: float) -> float:
        """What one separate run of a comparison whose arms have `rounds_s` each measures: its round's share."""
        return rounds_s / max(1, self.sequential_rounds)

    @property
    def turn_s(self) -> float:
        """Seconds of every turn, the same for both arms."""
        return self.turn_length_s or min(_MAX_TURN_S, window_for(self.rounds_s))


@dataclass(frozen=True)
class PairResult:
    """Two configs compared round by round; `ratio*` are B over A (above 1: B is faster).

    Attributes:
        mode: `alternating` (turns while the other arm is stopped) or `sequential` (separate runs).
        mode_reason: why the comparison is sequential (None when alternating).
        a, b: each arm's trial result (its bench holds its own measured windows).
        a_rates, b_rates: each turn's figure of each arm (samples/s, or steps/s without samples; under the
            latency objective, calls/s at the turn's median call): A's turns frame B's, so A has one more when
            the comparison ran to its end.
        stopped_by: `ci`, `clear` (the CI wholly on one side of `decide_at`), `time`, `rounds`; `ended`
            (an arm's script finished first) or `failed` (an arm failed, and the other was not judged).
        other_load_a, other_load_b: cores other processes used during each arm's turns (None: unread).
        usable_cores: the cores this host gives torchpace (to judge the other load against).
        reused: the arms (`a`, `b`) whose process came from an earlier comparison (`KeptArms`): their
            start-up, guard steps and warm-up were spent there, and no process was started for them.
    """

    mode: str
    a: TrialResult
    b: TrialResult
    a_rates: tuple[float, ...] = ()
    b_rates: tuple[float, ...] = ()
    stopped_by: str = "failed"
    mode_reason: str | None = None
    other_load_a: float | None = None
    other_load_b: float | None = None
    usable_cores: int | None = None
    wall_time_s: float = 0.0
    reused: tuple[str, ...] = ()

    @property
    def ratios(self) -> list[float]:
        return paired_ratios(self.a_rates, self.b_rates)

    @property
    def summary(self) -> Summary | None:
        """Median ratio B / A with its 95% CI (None without a round)."""
        return summarize(self.ratios) if self.ratios else None

    @property
    def ok(self) -> bool:
        return self.a.ok and self.b.ok and bool(self.ratios)

    def to_dict(self) -> dict[str, Any]:
        """JSON: the arms' results, every round's figures, and the ratio with its CI."""
        data = asdict(self)
        data.update(a=self.a.to_dict(), b=self.b.to_dict(), ratios=self.ratios, **ratio_fields(self.summary))
        return data


def paired_ratios(a_rates: Sequence[float], b_rates: Sequence[float]) -> list[float]:
    """Each round's B / A, from turns taken A B A B ... (A first, `a_rates` and `b_rates` each arm's in order).

    Every three turns are a round: the middle turn against the mean of the two around it, so that a drift
    linear over the round cancels; the middle arm alternates (A B A, then B A B), so each arm is the
    middle of every other round, and each turn serves one round. Rounds are thus independent when turns
    are, and a turn many times slower than the rest moves one round whichever arm it was.
    """
    turns = [rate for pair in zip(a_rates, b_rates) for rate in pair] + list(a_rates[len(b_rates):len(b_rates) + 1])
    ratios = []
    for start in range(0, len(turns) - TURNS_PER_ROUND + 1, TURNS_PER_ROUND):
        before, middle, after = turns[start:start + TURNS_PER_ROUND]
        if min(before, middle, after) > 0:  # a turn that measured nothing leaves its round out
            frame = (before + after) / 2
            ratios.append(middle / frame if start % 2 == 0 else frame / middle)  # A first at even turns
    return ratios


def ratio_fields(summary: Summary | None) -> dict[str, Any]:
    """The ratio figures of a comparison, named as every output shows them (None without a round)."""
    if summary is None:
        return {"ratio": None, "ratio_ci_low": None, "ratio_ci_high": None, "ratio_ci_coverage": None, "rounds": 0}
    return {"ratio": summary.median, "ratio_ci_low": summary.ci_low, "ratio_ci_high": summary.ci_high,
            "ratio_ci_coverage": summary.ci_coverage, "rounds": summary.n}


def rounds_time(options: PairOptions, warmups_s: float) -> float:
    """Seconds the rounds may take after warm-ups that took `warmups_s` (see `PairOptions.warmups_count`)."""
    if not options.warmups_count:
        return options.rounds_s
    return max(options.rounds_s / 2, options.rounds_s - warmups_s)


def sequential_reason(spec_a: TrialSpec, spec_b: TrialSpec, *, peak_bytes: int | None = None,
                      available_bytes: int | None = None, new_processes: int = 2) -> str | None:
    """Why the two arms cannot take turns as two processes held at once (None: they can).

    Args:
        peak_bytes: a peak memory one arm is expected to reach (e.g. the baseline's), device or host.
        available_bytes: the memory free for the arms to start on that device (or host).
        new_processes: the arms to start (an arm kept from an earlier comparison holds its memory already).
    """
    ranks = max(nproc_of(spec_a.config), nproc_of(spec_b.config))
    if ranks > 1:
        return f"a config runs {ranks} processes (torchrun), which cannot be stopped and continued as one"
    script_ranks = max(spec_a.script_ranks or 1, spec_b.script_ranks or 1)
    if script_ranks > 1:
        return f"the script runs {script_ranks} ranks, measured as one job in separate runs"
    if spec_a.script_mode != "bench" or spec_b.script_mode != "bench" or spec_a.profile or spec_b.profile:
        return "a profiled run is not measured in turns"
    if not fits_beside(peak_bytes, available_bytes, new_processes):
        runs = "two runs" if new_processes == 2 else "another run beside the one kept"
        return f"{runs} of {peak_bytes / 2**30:.1f} GiB peak memory would not fit in the {available_bytes / 2**30:.1f} GiB free"
    return None


def fits_beside(peak_bytes: int | None, available_bytes: int | None, processes: int) -> bool:
    """Whether `processes` more processes of `peak_bytes` each fit in the memory free (unknown: they do)."""
    return not (peak_bytes and available_bytes is not None and processes * peak_bytes > _HOLD_BOTH_SHARE * available_bytes)


def rounds_stop(ratios: Sequence[float], options: PairOptions, now: float, rounds_end: float) -> str:
    """Why the rounds stop after `ratios` (their B / A so far), or "" while they go on: `ci` once at least
    `min_rounds` give a CI within `target_ci_rel`, `clear` once that CI lies wholly on one side of `decide_at`,
    `rounds` at `max_rounds`, `time` once `now` reaches `rounds_end` (monotonic seconds)."""
    summary = summarize(list(ratios)) if ratios else None
    enough = len(ratios) >= options.min_rounds and summary is not None
    if enough and summary.ci_rel_halfwidth <= options.target_ci_rel:
        return "ci"
    if enough and options.decide_at is not None and not summary.ci_low <= options.decide_at <= summary.ci_high:
        return "clear"
    if options.max_rounds is not None and len(ratios) >= options.max_rounds:
        return "rounds"
    if now >= rounds_end:
        return "time"
    return ""


def separate_run_spec(spec: TrialSpec, options: PairOptions) -> TrialSpec:
    """One separate run of `spec`'s arm: it measures its round's share of the arm's time, after a warm-up that
    may take as long as a whole trial's (a sixth of the time would leave most warm-ups unconverged)."""
    return replace(spec, max_time_s=options.run_time_s(spec.max_time_s), warmup_s=WARMUP_SHARE * spec.max_time_s)


def pooled_runs(runs: Sequence[TrialResult]) -> TrialResult:
    """One arm's separate runs as one result: the first run's, its windows those of every run."""
    first = runs[0]
    throughput = pool_throughput([r.bench.throughput for r in runs])
    return replace(first, bench=replace(first.bench, throughput=throughput))



def objective_figure(bench: BenchResult | None) -> float | None:
    """A separate run's figure by default: its objective's value (samples/s, else steps/s)."""
    return bench.objective.value if bench is not None else None


def median_load(runs: Sequence[TrialResult]) -> float | None:
    """The median of the other load the separate runs of one arm recorded (None: none recorded)."""
    loads = [r.bench.other_load_cores for r in runs if r.bench and r.bench.other_load_cores is not None]
    return statistics.median(loads) if loads else None
