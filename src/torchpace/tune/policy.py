"""The greedy tuning policy, pure: recorded trials in, the next trial (and every decision) out.

The tuning guides' loop, made honest:

1. measure the baseline (plain PyTorch defaults) twice: the spread of the two is the first noise
   estimate;
2. for each stage (system -> data -> compute -> memory; the stage the baseline's profile verdict
   points at goes first), re-measure the incumbent at the stage boundary (catches machine drift), then for each
   knob try every value from the incumbent, one knob at a time;
3. accept a knob's best value only when it passed the convergence guard and beat the incumbent (the
   median of its last three measurements) by more than the measured noise; a failed value (crash,
   OOM, NaN, timeout) is never retried;
4. a best value whose gain is not clear, more than half the noise but not twice it, is neither taken
   nor dropped on one measurement: it is measured once more (and, first, the incumbent too when its
   figure rests on a single run, so the runs alternate A B A B), and it is accepted when the mean of
   its two runs beats the incumbent by the noise of a mean of two (noise / sqrt 2). On a noisy host
   (15-20% between trial processes on a shared 2-core machine) one lucky run then decides less: the
   best of several values measured once is biased upward, and a value accepted on one run becomes
   the figure the next knob is compared with;
5. a measurement that is not *settled* is never accepted on its own, however large its gain: its
   warm-up did not converge, it has fewer windows than a CI needs (`MIN_WINDOWS_FOR_CI`), or its CI
   is wider than the noise band. Such a value goes through step 4's second run, and an unsettled run
   cannot raise the figure: the decision takes the lower of the two runs instead of their mean (a
   12x "gain" on one window with an unconverged warm-up is then measured again, not taken).

The noise is the median relative spread of the repeated measurements of one config taken close in
time (the baseline pair and each confirmation's pairs); stage-boundary re-measurements track drift
instead and do not count as noise.

Because every decision is recomputed from the trial records, a killed tune resumes exactly where
it stopped, and several processes on one study each take a different pending trial.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable

from torchpace.measure.stats import MIN_WINDOWS_FOR_CI
from torchpace.tune.space import KnobSpace

_NOISE_FLOOR = 0.01  # never accept a change smaller than 1%: below what any host measures reliably
_INPUT_BOUND_FIRST = 0.25  # baseline waiting >= 25% of its step on data: try data knobs first
_RECENT_MEASUREMENTS = 3  # the incumbent's figure is the median of its last three measurements
_CONFIRM_BAND = (0.5, 2.0)  # a gain above this share of the threshold but not above this multiple is measured again

COMPLETE, RUNNING, RETRY = "complete", "running", "retry"


@dataclass(frozen=True)
class Record:
    """One trial as the policy sees it.

    Attributes:
        slot: which planned trial this was (e.g. `baseline`, `remeasure:data`, `cand:data.num_workers=2`).
        config: knob values that differ from the defaults.
        state: complete, running (in flight elsewhere) or retry (cut by the budget; run it again).
        status: the trial's failure class, or `ok`.
        samples_per_s / ci_rel: the measured objective figure, higher is better, and its relative CI
            half-width (None unless ok): samples/s, or 1 / p50 latency under `--objective latency`
            (see `torchpace.tune.objective`); the policy only compares these figures.
        guard_ok: the convergence guard's verdict (None: not checked).
        warmup_converged: whether the bench's warm-up windows agreed before measuring (None: unknown).
        windows: how many windows the figure is the median of (None: unknown).
    """

    slot: str
    config: dict
    state: str = COMPLETE
    status: str = "ok"
    samples_per_s: float | None = None
    ci_rel: float | None = None
    guard_ok: bool | None = None
    input_bound_frac: float | None = None
    verdict: str | None = None  # the profile's bottleneck verdict (baseline only), e.g. "input-bound"
    warmup_converged: bool | None = None
    windows: int | None = None

    @property
    def usable(self) -> bool:
        return self.state == COMPLETE and self.status == "ok" and self.guard_ok is not False and self.samples_per_s is not None

    def unsettled(self, noise_frac: float) -> str | None:
        """Why this measurement cannot be taken on its own (None when it can): an unconverged warm-up,
        fewer windows than a CI needs, or a CI half-width wider than `noise_frac` (relative)."""
        if self.warmup_converged is False:
            return "its warm-up did not converge"
        if self.windows is not None and self.windows < MIN_WINDOWS_FOR_CI:
            return f"{self.windows} window(s), fewer than the {MIN_WINDOWS_FOR_CI} a CI needs"
        if self.ci_rel is not None and self.ci_rel > noise_frac:
            return f"its CI (±{self.ci_rel:.1%}) is wider than the noise ({noise_frac:.1%})"
        return None


@dataclass(frozen=True)
class Proposal:
    """The next trial to run."""

    slot: str
    kind: str  # baseline | remeasure | candidate
    config: dict
    stage: str | None = None
    knob: str | None = None
    value: object = None


@dataclass(frozen=True)
class Decision:
    """What the policy concluded about one knob."""

    stage: str
    knob: str
    accepted_value: object | None
    incumbent_samples_per_s: float
    best_samples_per_s: float | None
    threshold_frac: float
    reason: str


@dataclass
class GreedyState:
    """The replayed state: what to run next, or that the search must wait or is done."""

    next: Proposal | None = None
    waiting: bool = False
    done: bool = False
    failed_baseline: str | None = None
    incumbent: dict = field(default_factory=dict)
    incumbent_samples_per_s: float | None = None
    baseline_samples_per_s: float | None = None
    noise_spreads: list[float] = field(default_factory=list)  # relative spreads of repeated measurements
    noise_ci_floor: float = _NOISE_FLOOR  # the baseline runs' own CI half-widths: the noise is never below them
    decisions: list[Decision] = field(default_factory=list)
    stage_order: list[str] = field(default_factory=list)

    @property
    def noise_frac(self) -> float:
        """The relative noise: the median spread of every repeated pair, never below the CI floor."""
        return max(self.noise_ci_floor, statistics.median(self.noise_spreads)) if self.noise_spreads else self.noise_ci_floor


class _Blocked(Exception):
    """Raised inside the replay when a needed trial is not finished yet."""


class _Replay:
    """Walks the planned trial sequence against the records."""

    def __init__(self, records: Iterable[Record]):
        self.by_slot = {r.slot: r for r in records if r.state != RETRY}
        self.state = GreedyState()

    def need(self, proposal: Proposal) -> Record | None:
        """The record of `proposal`'s slot; None (and the proposal noted as next) if not run yet."""
        record = self.by_slot.get(proposal.slot)
        if record is not None and record.state == COMPLETE:
            return record
        if record is None and self.state.next is None:
            self.state.next = proposal
        return None

    def need_all(self, proposals: list[Proposal]) -> list[Record]:
        records = [self.need(p) for p in proposals]
        if any(r is None for r in records):
            raise _Blocked
        return records


def order_stages(stages: list[str], baseline: Record) -> list[str]:
    """Stage order for this workload: the stages the baseline's profile verdict points at go first
    (e.g. data for input-bound); without a verdict, data first when the bench measured the baseline
    waiting on data for >= 25% of its step; otherwise the order given."""
    first: list[str] = []
    if baseline.verdict:
        from torchpace.profile.verdict import stages_to_try_first

        first = stages_to_try_first(baseline.verdict)
    elif baseline.input_bound_frac is not None and baseline.input_bound_frac >= _INPUT_BOUND_FIRST:
        first = ["data"]
    first = [s for s in first if s in stages]
    return first + [s for s in stages if s not in first]


def plan_greedy(space: list[KnobSpace], records: Iterable[Record],
                conflicts: Callable[[dict], str | None] = lambda config: None) -> GreedyState:
    """Replay every decision from `records` and say what to run next.

    Args:
        space: the knobs to tune, in stage order.
        records: all trials so far (any order of completion; slots identify them).
        conflicts: returns why a config cannot run (e.g. prefetch without workers), or None.
    """
    replay = _Replay(records)
    state = replay.state
    try:
        _walk(space, replay, conflicts)
        state.done = state.next is None and not state.failed_baseline
    except _Blocked:
        state.waiting = state.next is None
    return state


def _walk(space: list[KnobSpace], replay: _Replay, conflicts) -> None:
    state = replay.state
    base, again = replay.need_all([Proposal("baseline", "baseline", {}), Proposal("baseline#2", "remeasure", {})])
    if not base.usable:
        state.failed_baseline = f"the baseline trial failed ({base.status}); nothing to compare against"
        return
    state.baseline_samples_per_s = base.samples_per_s
    state.noise_ci_floor = max(_NOISE_FLOOR, base.ci_rel or 0.0, again.ci_rel or 0.0)
    if again.usable:
        state.noise_spreads.append(_spread(base, again))
    measurements = [r for r in (base, again) if r.usable]
    state.incumbent_samples_per_s = _estimate(measurements)[0]
    stages = list(dict.fromkeys(k.stage for k in space))
    state.stage_order = order_stages(stages, base)
    for index, stage in enumerate(state.stage_order):
        if index > 0:
            remeasured = replay.need_all([Proposal(f"remeasure:{stage}", "remeasure", dict(state.incumbent), stage)])[0]
            if remeasured.usable:
                measurements.append(remeasured)
                state.incumbent_samples_per_s = _estimate(measurements)[0]
        for knob in (k for k in space if k.stage == stage):
            measurements = _decide_knob(knob, replay, conflicts, measurements)


def _estimate(measurements: list[Record]) -> tuple[float, float]:
    """(samples/s, CI half-width) of the incumbent: medians over its last three measurements.

    The median of the recent re-measurements follows real drift (a host that stays slower) within
    a stage or two, while one measurement taken during a load spike cannot move it on its own.
    """
    recent = measurements[-_RECENT_MEASUREMENTS:]
    return (statistics.median(r.samples_per_s for r in recent), statistics.median(r.ci_rel or 0.0 for r in recent))


def _decide_knob(knob: KnobSpace, replay: _Replay, conflicts, measurements: list[Record]) -> list[Record]:
    """Try every value of `knob` from the incumbent; returns the (new) incumbent's measurements."""
    state = replay.state
    current = state.incumbent.get(knob.name, knob.default)
    proposals = []
    for value in knob.values:
        if value == current:
            continue
        config = _with(state.incumbent, knob, value)
        if conflicts(config) is not None and value in knob.companions:  # e.g. 2 processes come with DDP
            config = {**config, **knob.companions[value]}
        if conflicts(config) is None:
            proposals.append(Proposal(f"cand:{knob.name}={value}", "candidate", config, knob.stage, knob.name, value))
    if not proposals:
        return measurements
    records = replay.need_all(proposals)
    usable = [(r, p) for r, p in zip(records, proposals) if r.usable]
    inc_sps, inc_ci = _estimate(measurements)
    if not usable:
        state.decisions.append(Decision(knob.stage, knob.name, None, inc_sps, None, state.noise_frac,
                                        "rejected: every value failed or failed the guard"))
        return measurements
    best, proposal = max(usable, key=lambda rp: rp[0].samples_per_s)
    threshold = max(state.noise_frac, (best.ci_rel or 0.0) + inc_ci)
    gain = best.samples_per_s / inc_sps - 1
    low, high = _CONFIRM_BAND
    unsettled = best.unsettled(state.noise_frac)
    if gain > high * threshold and unsettled is None:
        return _accept(state, proposal, [best], best.samples_per_s, inc_sps, threshold,
                       f"accepted: {gain:+.1%}, over twice the noise ({threshold:.1%})")
    if gain <= max(_NOISE_FLOOR, low * threshold):
        verdict = f"within the noise ({threshold:.1%})" if gain > 0 else "no faster"
        _reject(state, proposal, best.samples_per_s, inc_sps, threshold,
                f"rejected: best {knob.name}={proposal.value} gives {gain:+.1%}, {verdict}")
        return measurements
    return _confirm(replay, proposal, best, measurements, gain, threshold, unsettled)


def _confirm(replay: _Replay, proposal: Proposal, first: Record, measurements: list[Record], first_gain: float,
             first_threshold: float, unsettled: str | None = None) -> list[Record]:
    """Measure the candidate once more (the incumbent first when its figure rests on one run), and decide
    on the mean of the candidate's two runs, or on the lower of them when either run is unsettled."""
    state = replay.state
    knob = proposal.knob
    again = [Proposal(f"confirm:{knob}={proposal.value}", "candidate", proposal.config, proposal.stage, knob, proposal.value)]
    if len(measurements) < 2:
        again.insert(0, Proposal(f"confirm-incumbent:{knob}", "remeasure", dict(state.incumbent), proposal.stage, knob))
    *incumbent_runs, cand_again = replay.need_all(again)
    for run in incumbent_runs:
        if run.usable:
            state.noise_spreads.append(_spread(measurements[-1], run))
            measurements = [*measurements, run]
    inc_sps, inc_ci = _estimate(measurements)
    why = f"not settled ({unsettled})" if unsettled else f"not clear against the noise ({first_threshold:.1%})"
    first_said = f"first run {first_gain:+.1%}, {why}, so measured again"
    if not cand_again.usable:
        _reject(state, proposal, first.samples_per_s, inc_sps, first_threshold,
                f"rejected: {first_said}, and the second run failed ({cand_again.status})")
        return measurements
    state.noise_spreads.append(_spread(first, cand_again))
    runs = [first.samples_per_s, cand_again.samples_per_s]
    threshold = max(_NOISE_FLOOR, state.noise_frac / math.sqrt(2), (first.ci_rel or 0.0) + inc_ci)
    if unsettled or cand_again.unsettled(state.noise_frac):
        figure, of_two = min(runs), "the lower of two (a run was not settled)"
    else:
        figure, of_two = statistics.fmean(runs), "the mean of two"
    gain = figure / inc_sps - 1
    said = f"{first_said}: {of_two} gives {gain:+.1%} vs the noise of a mean of two ({threshold:.1%})"
    if gain > threshold:
        return _accept(state, proposal, [first, cand_again], figure, inc_sps, threshold, f"accepted: {said}")
    _reject(state, proposal, figure, inc_sps, threshold, f"rejected: {said}")
    return measurements


def _accept(state: GreedyState, proposal: Proposal, runs: list[Record], figure: float, inc_sps: float, threshold: float,
            reason: str) -> list[Record]:
    """Make `proposal` the incumbent, at `figure` (its one run, or the mean of its runs); returns its measurements."""
    state.incumbent = proposal.config
    state.incumbent_samples_per_s = figure
    state.decisions.append(Decision(proposal.stage, proposal.knob, proposal.value, inc_sps, figure, threshold, reason))
    return runs


def _reject(state: GreedyState, proposal: Proposal, best_sps: float, inc_sps: float, threshold: float, reason: str) -> None:
    state.decisions.append(Decision(proposal.stage, proposal.knob, None, inc_sps, best_sps, threshold, reason))


def _with(config: dict, knob: KnobSpace, value: object) -> dict:
    merged = dict(config)
    if value == knob.default:
        merged.pop(knob.name, None)
    else:
        merged[knob.name] = value
    return merged


def _spread(first: Record, second: Record) -> float:
    """The relative spread of two runs of one config (one sample of the noise)."""
    return abs(first.samples_per_s - second.samples_per_s) / min(first.samples_per_s, second.samples_per_s)
