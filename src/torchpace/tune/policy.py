"""The greedy tuning policy, pure: recorded trials in, the next trial (and every decision) out.

The tuning guides' loop, made honest, with every decision a *paired comparison*: the candidate and
the incumbent measured in alternation, as two trial processes taking turns on the host
(`torchpace.trial.pair`), decided on the median of the per-round ratios and its 95% CI. The host's
drift falls on both arms alike, so no stage-boundary re-measurement is needed, and the noise band of a
decision is the spread of its own paired ratios, not the spread between two separate runs.

1. measure the baseline (plain PyTorch defaults) alone (slot `baseline`: its profile verdict orders
   the stages, its guard curve is the reference), then compare the defaults with themselves (slot
   `noise`, an A/A comparison: its CI is the noise band of this host and workload, shown with the
   result, and its guard curve tells whether the guard can judge this workload at all);
2. for each stage (system -> data -> compute -> memory; the stage the baseline's profile verdict
   points at goes first, or without a verdict the one its measured input wait points at), for each
   knob, compare every value with the incumbent, one knob at a time (slots `pair:KNOB=VALUE`); a
   failed value (crash, OOM, NaN, timeout) is never retried.
   When the A/A comparison (since revision 5, or a decision's comparisons) saw other processes' load that is
   material (`measure.contention.is_material`), the knobs that share cores (`KnobSpace.shares_cores`: threads,
   workers, ranks) are decided before all others (those left), in stage order: under load their effect is the largest and changes how every other
   comparison behaves (a two-thread step beside busy processes takes bimodal turns), so the other
   knobs are then judged against an incumbent that fits the load, not against the defaults' threads;
3. the best value (highest median ratio) is accepted when the convergence guard passed, its median
   gain is over 1% and its whole 95% CI is above 1; rejected when its median gain is 1% or less and
   its whole CI is at or under a 1% gain (its rounds stop early once the CI lies wholly above or below
   a 1% gain: more would not change the decision);
4. a gain in between (its CI reaches 1), a loss whose CI reaches over a 1% gain, a comparison that is not *settled* (fewer rounds than a
   CI needs, an arm whose warm-up did not converge), or a loss on fewer rounds than a CI needs (the
   budget or the time cap ended it early), is compared once more (`confirm-pair:KNOB=VALUE`)
   and decided on the two comparisons' rounds pooled, accepted only on at least the rounds a CI
   needs (`MIN_WINDOWS_FOR_CI`), as a loss is: one lucky comparison of one value among several
   then decides less. When the first comparison had fewer rounds than a CI needs (a slow step on a
   busy host: the warm-ups took most of the trial time), the second runs for a multiple of the trial
   time (`Proposal.time_factor`, up to `_MAX_STRETCH`) sized to give the missing rounds;
5. once a value is kept, the second best value of that knob, when its CI reaches both a gain over 1% and
   the kept value's CI (it could be as fast), is compared with the kept value head to head
   (`duel:KNOB=VALUE`, the kept value as the reference arm) and kept instead when that comparison
   alone is a clear gain (median over 1%, whole CI above 1, settled): a decision of its own, a step
   of the waterfall over the value kept before it. Each value was compared with the incumbent by its
   own pair of processes, and a process's pace can differ by some percent from another's of the same
   config, so the highest of several medians is partly the luckiest pair;
6. once every knob is decided, the tuned config is compared with the defaults (slot `final`): that
   ratio and its CI are the speedup reported. When the budget left would not hold both the next
   candidate's comparison and the final one (the tuner judges that: `plan_greedy(..., finish=True)`),
   the knobs not yet decided are left so and the config kept so far gets its final comparison, so
   a tune cut by its budget still reports a tuned-vs-defaults ratio measured in alternation. A final
   comparison whose config is no longer the incumbent (a `--resume` with a larger budget decided
   more knobs) is kept as it was, and the new incumbent gets one of its own (`final:2`, ...).

Because every decision is recomputed from the trial records, a killed tune resumes exactly where
it stopped, and several processes on one study each take a different pending trial.

Paired studies carry the policy's revision (`GREEDY_REVISION`, stored as `StudyAttrs.greedy_revision`) and
are replayed with their own: revision 1 (studies tuned before revisions were recorded) decides the knobs in
stage order whatever the load, and accepts after a second comparison on any number of pooled rounds;
revision 2 brought the cores-first order, the pooled rounds' floor and the stretched second comparison above;
revision 3 stretches no second comparison of separate runs (several ranks): those give their rounds
(`PairOptions.sequential_rounds`) however long each run is, so a longer one would add no round, only
time (beside a busy process the `make demo` tune judged such a stretched second comparison of
`nproc_per_node=2` too long for its budget and ended a minute early); revision 4 decides a loss at once only
on a CI wholly at or under a 1% gain (before, any median of 1% or less with a CI's rounds) and brought the
head-to-head comparison of a knob's two best values (step 5); revision 5 (`_cores_next`, `_host_changed`):
- an unmodified script's own settings are the baseline's (`Record.script_settings`: what its DataLoader and
  optimizer were given, read by the hook): a knob's value the script already runs with is no candidate
  (before, `--workers 2` made `data.num_workers=2` an A/A comparison labelled as a change), the knob's default
  is one where the script chose otherwise (set explicitly, so it reaches the script over its own argument),
  and conflicts are judged on what would run, the script's settings under the config's;
- the knobs that share cores are decided next also when a decision's comparisons, not only the A/A
  comparison, saw material other load (load that came after the A/A comparison: the knobs decided before it
  were judged on a quiet host, those after it are judged against an incumbent that fits it);
- when a value's second comparison does not keep it, the next value whose own first comparison was a clear
  gain (its whole CI above 1, median over the floor) is judged in its place, in the order of the medians
  (before, the whole knob was rejected: `threads.intra_op=1` at 1.297x, 95% CI 1.223-376, was dropped
  because the confirmation of `2` failed);
- a gain after a second comparison is kept only when that comparison on its own has the rounds a CI needs,
  as a first comparison decides a loss or a gain at once only on them (two pairs of processes each too
  short to say are not pooled into one that says), and the second comparison is stretched to give them;
- a decision on a knob that shares cores whose incumbent arm ran `measure.contention.HOST_CHANGE` times off
  that config's earlier measurements, with no other process's load to show why (the report's host-change
  note), is not taken on that comparison: it is compared once more and decided on both;
- the tuner keeps the time of the final comparison with the defaults back from the candidates compared with a
  kept config (`tune.executor`), so that a tune its budget stops still measures its speedup.
Revision 6 (`guard_scatter`): the convergence guard's absolute tolerance widens to the baseline curve's own
step-to-step scatter (`tune.guard.check_guard`): on a ResNet-18 at batch 32 the fixed 0.05 failed loader
workers (which seed each worker's augmentations apart) and channels_last on chance departures of its curve.
Revision 7 (`order_stages`): a baseline with no profile verdict (an unmodified script's) whose step waited on
its DataLoader for less than a quarter of its time has its compute stage decided first, as a compute-bound
verdict orders it: on the PyTorch ImageNet example (ResNet-18, 224 px, a 2 s step on 2 cores) a 15-minute
tune in the order system -> data -> compute decided the allocator and threads and ran out of budget before
bf16 and channels_last, the levers worth 1.5-1.9x there.

Studies tuned before paired comparisons (their metadata has no `paired`) are replayed, resumed and
reported with the policy they were tuned with (`plan_greedy(..., paired=False)`): each trial one
config measured alone; baseline twice (noise = their spread); the incumbent re-measured at each stage
boundary; a best value accepted beyond twice the noise, rejected under half of it, else measured once
more (`confirm-incumbent:`, `confirm:`) and decided on the mean of its two runs, or on the lower of
them when a run was not settled.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from torchpace.measure.contention import host_change, is_material
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI, Summary, summarize, summary_ratio_text
from torchpace.profile.verdict import VerdictKind, stages_to_try_first
from torchpace.trial.schedule import SEQUENTIAL
from torchpace.tune.space import KnobSpace

GREEDY_REVISION = 7  # the paired policy's revision a new study is tuned with (see the module's docstring)
_NOISE_FLOOR = 0.01  # never accept a change smaller than 1%: below what any host measures reliably
ACCEPT_FLOOR = _NOISE_FLOOR  # the smallest gain a paired comparison must show (the tuner stops its rounds once clear of it)
_INPUT_BOUND_FIRST = 0.25  # baseline waiting >= 25% of its step on data: try data knobs first
_RECENT_MEASUREMENTS = 3  # the incumbent's figure is the median of its last three measurements
_MAX_STRETCH = 4  # a second comparison runs for at most this many times the trial time
_CONFIRM_BAND = (0.5, 2.0)  # a gain above this share of the threshold but not above this multiple is measured again

COMPLETE, RUNNING, RETRY = "complete", "running", "retry"
PARTNER_STATUS = "partner"  # a comparison whose reference arm failed: the candidate was not judged
# such a comparison runs again (the reference worked before, the failure may be the host's), but a slot
# whose reference failed this many times is taken as not judged, not retried for ever
PARTNER_TRIES = 2


@dataclass(frozen=True)
class Record:
    """One trial as the policy sees it.

    Attributes:
        slot: which planned trial this was (e.g. `baseline`, `remeasure:data`, `cand:data.num_workers=2`).
        config: knob values that differ from the defaults.
        state: complete, running (in flight elsewhere) or retry (cut by the budget; run it again).
        status: the trial's failure class, or `ok`.
        figure / ci_rel: the objective's figure as "higher is better" (`Objective.score`: samples/s,
            steps/s for a script whose samples per step are unknown, or 1 / p50 latency under
            `--objective latency`) and its relative CI half-width (None unless ok); the policy only
            compares these figures, of one study, all in one unit.
        guard_ok: the convergence guard's verdict (None: not checked).
        warmup_converged: whether the bench's warm-up windows agreed before measuring (None: unknown).
        windows: how many windows the figure is the median of (None: unknown).
        reference: a paired comparison's other arm (A, the incumbent), None for a trial measured alone;
            `figure` is then the candidate arm's (B) figure over its turns.
        ratios: each round's B / A (see `torchpace.trial.schedule.paired_ratios`).
        reference_figure, reference_warmup_converged: the incumbent arm's figure and warm-up.
        mode: `alternating` or `sequential` (separate runs).
        other_load_cores: the most cores other processes used during either arm's turns.
        usable_cores: the cores the host gave torchpace (a paired comparison's; None: unknown).
        script_settings: an unmodified script's own values of the knobs that reach it (what its DataLoader and
            optimizer were given, `ScriptInfo.script_settings`): the baseline's, which ran with them.
        ended: a paired comparison that an arm's script ended by finishing (its rounds are what its steps gave).
    """

    slot: str
    config: dict
    state: str = COMPLETE
    status: str = "ok"
    figure: float | None = None
    ci_rel: float | None = None
    guard_ok: bool | None = None
    input_bound_frac: float | None = None
    verdict: str | None = None  # the profile's bottleneck verdict (baseline only), e.g. "input-bound"
    warmup_converged: bool | None = None
    windows: int | None = None
    reference: dict | None = None
    ratios: tuple[float, ...] = ()
    reference_figure: float | None = None
    reference_warmup_converged: bool | None = None
    mode: str | None = None
    other_load_cores: float | None = None
    usable_cores: int | None = None
    script_settings: dict = field(default_factory=dict)
    ended: bool = False
    error: str = ""  # a trial that failed: why, its first line (e.g. why a knob does not apply to the model)

    @property
    def usable(self) -> bool:
        measured = self.ratios if self.reference is not None else self.figure is not None
        return self.state == COMPLETE and self.status == "ok" and self.guard_ok is not False and bool(measured)

    def pair_unsettled(self) -> str | None:
        """Why this paired comparison cannot decide on its own (None when it can): fewer rounds than a CI
        needs, or an arm whose warm-up did not converge."""
        if len(self.ratios) < MIN_WINDOWS_FOR_CI:
            return f"{len(self.ratios)} round(s), fewer than the {MIN_WINDOWS_FOR_CI} a CI needs"
        if self.warmup_converged is False or self.reference_warmup_converged is False:
            return "an arm's warm-up did not converge"
        return None

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
    kind: str  # baseline | noise | candidate | final (paired); baseline | remeasure | candidate (alone)
    config: dict
    stage: str | None = None
    knob: str | None = None
    value: object = None
    reference: dict | None = None  # a paired comparison: the config measured in alternation with `config`
    time_factor: float = 1.0  # its trial time, as a multiple of the tune's `--trial-time`


@dataclass(frozen=True)
class Decision:
    """What the policy concluded about one knob.

    Attributes:
        accepted_value: the value kept, None when none was.
        incumbent_figure / best_figure: the incumbent's and the best value's figures, as `Record.figure`
            (in a paired comparison, each arm's median over its turns).
        threshold_frac: the smallest gain accepted (paired: the 1% floor; alone: the noise band).
        reason: the decision in words, with its figures.
        value: the value judged (the best usable one), None when no value could be judged.
        ratio, ratio_ci_low, ratio_ci_high, rounds: the deciding comparison's median B / A, its 95% CI
            and its rounds (confirmed comparisons: both pooled); None for decisions made alone.
        mode: how the deciding comparison ran (`alternating` / `sequential`).
        other_load_cores: the most cores other processes used during the deciding comparison.
        judged: False when no value could be compared (every one failed, or none could run).
    """

    stage: str
    knob: str
    accepted_value: object | None
    incumbent_figure: float | None
    best_figure: float | None
    threshold_frac: float
    reason: str
    value: object = None
    ratio: float | None = None
    ratio_ci_low: float | None = None
    ratio_ci_high: float | None = None
    rounds: int = 0
    mode: str | None = None
    other_load_cores: float | None = None
    judged: bool = True


@dataclass
class GreedyState:
    """The replayed state: what to run next, or that the search must wait or is done."""

    next: Proposal | None = None
    waiting: bool = False
    done: bool = False
    failed_baseline: str | None = None
    incumbent: dict = field(default_factory=dict)
    incumbent_figure: float | None = None
    baseline_figure: float | None = None
    noise_spreads: list[float] = field(default_factory=list)  # relative spreads of repeated measurements
    noise_ci_floor: float = _NOISE_FLOOR  # the baseline runs' own CI half-widths: the noise is never below them
    decisions: list[Decision] = field(default_factory=list)
    stage_order: list[str] = field(default_factory=list)
    paired: bool = True
    revision: int = GREEDY_REVISION  # paired: the policy's revision the study is replayed with
    cores_first: str | None = None  # paired: why the knobs that share cores are decided first (None: they are not)
    cores_first_knobs: list[str] = field(default_factory=list)
    noise: Record | None = None  # paired: the defaults compared with themselves (A/A)
    final: Record | None = None  # paired: the tuned config compared with the defaults
    left_undecided: list[str] = field(default_factory=list)  # paired: knobs left for the final comparison (`finish`)
    # paired, revision 5: an unmodified script's own settings, the baseline's (`Record.script_settings`)
    script_settings: dict = field(default_factory=dict)

    @property
    def noise_frac(self) -> float:
        """The relative noise: paired, the half-width of the A/A comparison's CI (its ratios' spread); alone,
        the median spread of every repeated pair; never below the floor."""
        if self.paired:
            return max(_NOISE_FLOOR, summarize(list(self.noise.ratios)).ci_rel_halfwidth) if self.noise else _NOISE_FLOOR
        return max(self.noise_ci_floor, statistics.median(self.noise_spreads)) if self.noise_spreads else self.noise_ci_floor


class _Blocked(Exception):
    """Raised inside the replay when a needed trial is not finished yet."""


class _Replay:
    """Walks the planned trial sequence against the records."""

    def __init__(self, records: Iterable[Record]):
        self.records = list(records)  # in trial order
        self._order = {id(r): i for i, r in enumerate(self.records)}
        self.by_slot = {r.slot: r for r in self.records if r.state != RETRY}
        partnered: dict[str, list[Record]] = {}
        for r in self.records:
            if r.state == RETRY and r.status == PARTNER_STATUS:
                partnered.setdefault(r.slot, []).append(r)
        for slot, tries in partnered.items():  # a reference arm that fails again and again: stop retrying
            if slot not in self.by_slot and len(tries) >= PARTNER_TRIES:
                self.by_slot[slot] = replace(tries[-1], state=COMPLETE)
                self._order[id(self.by_slot[slot])] = self._order[id(tries[-1])]
        self.state = GreedyState()

    def before(self, record: Record) -> list[Record]:
        """The records of the trials started before `record`'s: what a decision on it could see when it was
        taken (a decision never changes with trials that came after it)."""
        end = self._order.get(id(record), len(self.records))
        return self.records[:end]

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


def order_stages(stages: list[str], baseline: Record, revision: int = 1) -> list[str]:
    """Stage order for this workload: the stages the baseline's profile verdict points at go first
    (e.g. data for input-bound); without a verdict (an unmodified script's baseline is measured, not
    profiled), data first when the bench measured the baseline waiting on data for >= 25% of its step,
    and since revision 7 compute first when it measured it waiting less (the verdict a profile gives
    such a step); otherwise the order given."""
    first: list[str] = []
    if baseline.verdict:
        first = stages_to_try_first(baseline.verdict)
    elif baseline.input_bound_frac is not None and baseline.input_bound_frac >= _INPUT_BOUND_FIRST:
        first = ["data"]
    elif baseline.input_bound_frac is not None and revision >= 7:
        first = stages_to_try_first(VerdictKind.COMPUTE)
    first = [s for s in first if s in stages]
    return first + [s for s in stages if s not in first]


def guard_scatter(paired: bool, revision: int) -> bool:
    """Whether a greedy study's convergence guard widens its absolute tolerance to the baseline curve's own
    step-to-step scatter (`tune.guard.check_guard`'s `scatter`): since revision 6."""
    return paired and revision >= 6


def plan_greedy(space: list[KnobSpace], records: Iterable[Record],
                conflicts: Callable[[dict], str | None] = lambda config: None, paired: bool = True,
                revision: int = GREEDY_REVISION, finish: bool = False) -> GreedyState:
    """Replay every decision from `records` and say what to run next.

    Args:
        space: the knobs to tune, in stage order.
        records: all trials so far (any order of completion; slots identify them).
        conflicts: returns why a config cannot run (e.g. prefetch without workers), or None.
        paired: decide by paired comparisons (every study since they came); False replays a study tuned
            before, each trial measured alone.
        revision: the paired policy's revision the study was tuned with (see the module's docstring).
        finish: paired: the budget left holds one more comparison, not two: instead of the next
            candidate, compare the config kept so far with the defaults (`GreedyState.left_undecided`
            names the knobs not decided).
    """
    replay = _Replay(records)
    state = replay.state
    state.paired, state.revision = paired, revision
    try:
        if paired:
            _walk_paired(space, replay, conflicts, finish)
        else:
            _walk(space, replay, conflicts)
        state.done = state.next is None and not state.failed_baseline
    except _Blocked:
        state.waiting = state.next is None
    return state


def _walk_paired(space: list[KnobSpace], replay: _Replay, conflicts, finish: bool = False) -> None:
    state = replay.state
    base = replay.need_all([Proposal("baseline", "baseline", {})])[0]
    if not base.usable:
        state.failed_baseline = f"the baseline trial failed ({base.status}); nothing to compare against"
        return
    state.baseline_figure = state.incumbent_figure = base.figure
    if state.revision >= 5:
        state.script_settings = dict(base.script_settings)
    noise = replay.need_all([Proposal("noise", "noise", {}, reference={})])[0]
    state.noise = noise if noise.usable else None  # a failed A/A comparison only leaves the noise unknown
    state.stage_order = order_stages(list(dict.fromkeys(k.stage for k in space)), base, state.revision)
    knobs = [k for stage in state.stage_order for k in space if k.stage == stage]
    if state.revision >= 2:
        state.cores_first = _cores_first(state.noise, knobs)
        if state.cores_first:  # stable: each group keeps the stage order
            knobs.sort(key=lambda k: not k.shares_cores)
            state.cores_first_knobs = [k.name for k in knobs if k.shares_cores]
    queue = list(knobs)
    while queue:
        knob = queue[0]
        try:
            _decide_knob_paired(knob, replay, conflicts)
        except _Blocked:
            # the budget holds one more comparison: the final one, when a config was kept (else nothing
            # would be compared; the candidate runs, and the budget may cut it)
            if not (finish and state.incumbent and state.next is not None and state.next.kind == "candidate"):
                raise
            state.next = None
            decided = {d.knob for d in state.decisions}  # a kept value whose second best was to be compared with it
            state.left_undecided = [k.name for k in queue if k.name not in decided]
            break
        queue.pop(0)
        if state.revision >= 5 and not state.cores_first and any(k.shares_cores for k in queue):
            state.cores_first = _cores_next(replay, knob)
            if state.cores_first:  # the knobs that share cores next, before those left of other stages
                queue.sort(key=lambda k: not k.shares_cores)
                state.cores_first_knobs = [k.name for k in queue if k.shares_cores]
    if state.incumbent:
        state.final = _need_final(replay, state.incumbent)


def is_final_slot(slot: str) -> bool:
    """Whether `slot` is a final comparison's (`final`, `final:2`, ...)."""
    return slot == "final" or slot.startswith("final:")


def _need_final(replay: _Replay, incumbent: dict) -> Record:
    """The final comparison of `incumbent` with the defaults: slot `final`, or `final:N` when the earlier
    final slots compared configs that are no longer the incumbent (see the module's docstring)."""
    n, slot = 1, "final"
    while slot in replay.by_slot and replay.by_slot[slot].config != incumbent:
        n += 1
        slot = f"final:{n}"
    return replay.need_all([Proposal(slot, "final", dict(incumbent), reference={})])[0]


def _cores_first(noise: Record | None, knobs: list[KnobSpace]) -> str | None:
    """Why the knobs that share cores are decided first (None when they are not): the A/A comparison saw
    other processes' load that is material, and some knob to tune shares cores."""
    if noise is None or not any(k.shares_cores for k in knobs):
        return None
    usable = noise.usable_cores or 1
    if not is_material(noise.other_load_cores, usable):
        return None
    return (f"other processes used {noise.other_load_cores:.1f} of {usable} cores during the A/A comparison, "
            "and under load the knobs that share cores change how every other comparison behaves")


def _cores_next(replay: _Replay, knob: KnobSpace) -> str | None:
    """Revision 5: why the knobs that share cores and are left are decided next (None when they are not): a
    comparison that decided `knob` saw other processes' load that is material, which the A/A comparison had not
    (the load came later): under it those knobs change how every later comparison behaves, as when the A/A
    comparison sees it (`_cores_first`)."""
    loaded = [(r.other_load_cores, r.usable_cores or 1) for r in _deciding_records(replay, knob.name)
              if is_material(r.other_load_cores, r.usable_cores or 1)]
    if not loaded:
        return None
    cores, usable = max(loaded)
    return (f"other processes used {cores:.1f} of {usable} cores during the comparisons of {knob.name}, "
            "and under load the knobs that share cores change how every other comparison behaves")


def _deciding_records(replay: _Replay, knob: str) -> list[Record]:
    """The records of the comparisons that judged `knob`'s values (first, second and head-to-head)."""
    prefixes = tuple(f"{kind}:{knob}=" for kind in ("pair", "confirm-pair", "duel"))
    return [r for slot, r in replay.by_slot.items() if slot.startswith(prefixes) and r.state == COMPLETE]


def _decide_knob_paired(knob: KnobSpace, replay: _Replay, conflicts) -> None:
    """Compare every value of `knob` with the incumbent, in alternation; keep the best when it is clear."""
    state = replay.state
    proposals = [Proposal(f"pair:{p.slot.partition(':')[2]}", "candidate", p.config, p.stage, p.knob, p.value,
                          reference=dict(state.incumbent))
                 for p in _candidates(knob, state.incumbent, conflicts, state.script_settings)]
    if not proposals:
        return
    records = replay.need_all(proposals)
    usable = [(r, p) for r, p in zip(records, proposals) if r.usable]
    if not usable:
        state.decisions.append(_not_judged(knob, records))
        return
    ranked = sorted(usable, key=lambda rp: summarize(list(rp[0].ratios)).median, reverse=True)  # stable: value order on ties
    confirmed = _judge_best(knob, replay, *ranked[0])
    judged = 1
    # revision 5: a confirmation that failed leaves the knob to the next value whose own comparison was a clear
    # gain (its whole CI above 1, its median over the floor), judged the same way, in the order of their medians
    while state.revision >= 5 and confirmed and state.decisions[-1].accepted_value is None:
        following = [rp for rp in ranked[judged:] if _clear_gain(summarize(list(rp[0].ratios)))]
        if not following:
            break
        judged = ranked.index(following[0]) + 1
        confirmed = _judge_best(knob, replay, *following[0])
    if state.revision >= 4 and len(ranked) > judged and state.decisions[-1].accepted_value is not None:
        _rematch(replay, knob, *ranked[judged])


def _judge_best(knob: KnobSpace, replay: _Replay, best: Record, proposal: Proposal) -> bool:
    """Decide on `knob`'s value of `proposal` from its comparison with the incumbent, comparing it again when that
    one comparison cannot decide; whether it was compared again."""
    state = replay.state
    summary = summarize(list(best.ratios))
    unsettled = best.pair_unsettled()
    # a loss is decided only on enough rounds for a CI: two rounds at 0.96 on a busy host say nothing;
    # since revision 4 only on a CI wholly under the floor: 0.99x with a CI up to 1.25 is not a loss yet
    clear_loss = state.revision < 4 or _never_a_gain(summary)
    # since revision 5 a decision on a knob that shares cores whose incumbent arm ran far off its config's other
    # measurements (the host changed, no other process's load to show it) is not taken on that one comparison
    changed = _host_changed(replay, knob, best) if state.revision >= 5 else None
    if summary.median - 1 <= _NOISE_FLOOR and len(best.ratios) >= MIN_WINDOWS_FOR_CI and clear_loss and not changed:
        verdict = "no faster" if summary.median <= 1 else f"under the {_NOISE_FLOOR:.0%} floor"
        _decide(state, proposal, best, [best], False, f"rejected: best {knob.name}={proposal.value} is "
                f"{_ratio_text(summary)}: {verdict}")
        return False
    if _clear_gain(summary) and unsettled is None and not changed:
        _decide(state, proposal, best, [best], True, f"accepted: {_ratio_text(summary)}, the whole CI above 1")
        return False
    stretch = _stretch(len(best.ratios), state.revision) if state.revision >= 2 and not (
        state.revision >= 3 and best.mode == SEQUENTIAL) else 1
    again = replay.need_all([Proposal(f"confirm-pair:{knob.name}={proposal.value}", "candidate", proposal.config,
                                      proposal.stage, knob.name, proposal.value, reference=dict(state.incumbent),
                                      time_factor=stretch)])[0]
    if changed:
        why = changed
    elif unsettled:
        why = f"not settled ({unsettled})"
    else:
        why = "its CI reaches 1" if summary.median - 1 > _NOISE_FLOOR else f"its CI reaches over the {_NOISE_FLOOR:.0%} floor"
    said = f"first comparison {_ratio_text(summary)}, {why}, so compared again"
    if stretch > 1:
        said += f" for {stretch}x the trial time"
    if not again.usable:
        _decide(state, proposal, best, [best], False, f"rejected: {said}, and the second comparison failed ({again.status})")
        return True
    pooled = summarize([*best.ratios, *again.ratios])
    accepted = _clear_gain(pooled)
    short = ""
    more = ("the script ends first: more steps or epochs through its own arguments give more" if again.ended or best.ended
            else "a longer --trial-time gives more")
    if accepted and state.revision >= 2 and pooled.n < MIN_WINDOWS_FOR_CI:  # a gain needs a CI's rounds, as a loss does
        accepted = False
        short = f", fewer rounds than the {MIN_WINDOWS_FOR_CI} a CI needs ({more})"
    elif accepted and state.revision >= 5 and len(again.ratios) < MIN_WINDOWS_FOR_CI:
        # the second comparison decides on its own rounds as a first one does (a loss at once, a gain at once):
        # two pairs of processes each too short to say, pooled, are not one that says
        accepted = False
        short = (f", the second comparison alone {len(again.ratios)} round(s), fewer than the {MIN_WINDOWS_FOR_CI} a CI "
                 f"needs ({more})")
    _decide(state, proposal, again, [best, again], accepted,
            f"{'accepted' if accepted else 'rejected'}: {said}: both pooled give {_ratio_text(pooled)}{short}")
    return True


def _host_changed(replay: _Replay, knob: KnobSpace, record: Record) -> str | None:
    """Why a comparison on `knob`, a knob that shares cores, cannot decide on its own (None when it can): its
    incumbent arm ran `measure.contention.HOST_CHANGE` times off the incumbent config's measurements before it
    in the study, and no other process's load was material to show why (`measure.contention.host_change`, the
    rule of the report's host-change note)."""
    if not knob.shares_cores or record.reference is None or is_material(record.other_load_cores, record.usable_cores or 1):
        return None
    config = dict(record.reference)
    earlier = replay.before(record)
    others = [r.figure for r in earlier if r.usable and r.config == config]  # alone, or a comparison's arm B
    others += [r.reference_figure for r in earlier if r.state == COMPLETE and r.reference == config and r.reference_figure]
    change = host_change(record.reference_figure, others)
    if change is None:
        return None
    pace = f"{1 - change:.0%} slower" if change < 1 else f"{change - 1:.0%} faster"
    return (f"the incumbent ran {pace} than in its {len(others)} earlier measurement(s), with no other process's load "
            "to show why (the host changed)")


def _rematch(replay: _Replay, knob: KnobSpace, second: Record, proposal: Proposal) -> None:
    """Revision 4: once a value of `knob` is kept, compare the second best with it when that one could be
    as fast (its CI reaches a gain over the floor and the kept value's CI), and keep it instead when it is
    clearly faster (a decision of its own, over the value just kept); otherwise the kept value's reason
    says how the second best fared.

    Each value was compared with the incumbent by its own pair of processes, and a process's own pace
    can differ by some percent from another's of the same config, so the highest median among several
    values is partly the luckiest pair: the two are compared with each other in alternation
    (`duel:KNOB=VALUE`)."""
    state = replay.state
    kept = state.decisions[-1]
    b = summarize(list(second.ratios))
    if _never_a_gain(b) or b.ci_high < kept.ratio_ci_low:
        return
    duel = Proposal(f"duel:{knob.name}={proposal.value}", "candidate", dict(proposal.config), proposal.stage, knob.name,
                    proposal.value, reference=dict(state.incumbent))
    record = replay.need_all([duel])[0]
    said = f"{knob.name}={proposal.value} (second best, {summary_ratio_text(b)[0]}) compared with it head to head"
    if not record.usable:
        said += f" failed ({record.status})"
    else:
        summary = summarize(list(record.ratios))
        if _clear_gain(summary) and record.pair_unsettled() is None:
            _decide(state, duel, record, [record], True, f"accepted: {said}: {_ratio_text(summary)}, the whole CI above 1")
            return
        said += f": {_ratio_text(summary)}, not clearly faster"
    state.decisions[-1] = replace(kept, reason=f"{kept.reason}; {said}")


def _clear_gain(summary: Summary) -> bool:
    """A gain a decision can take: median gain over the floor and the whole CI above 1."""
    return summary.median - 1 > _NOISE_FLOOR and summary.ci_low > 1


def _never_a_gain(summary: Summary) -> bool:
    """The whole CI at or under a gain of the floor: no gain worth keeping, whatever more rounds would say."""
    return summary.ci_high <= 1 + _NOISE_FLOOR


def _stretch(rounds: int, revision: int = GREEDY_REVISION) -> int:
    """The multiple of the trial time a second comparison runs for, after a first one of `rounds` rounds, at the
    first one's pace (at most `_MAX_STRETCH`): enough for the rounds a CI needs pooled (revisions 2-4), or on its
    own (revision 5, which decides a gain on the second comparison's own rounds)."""
    missing = MIN_WINDOWS_FOR_CI - (0 if revision >= 5 else rounds)
    if rounds >= MIN_WINDOWS_FOR_CI:
        return 1
    return min(_MAX_STRETCH, max(1, math.ceil(missing / max(rounds, 1))))


def _candidates(knob: KnobSpace, incumbent: dict, conflicts, own: dict | None = None) -> list[Proposal]:
    """One proposal per value of `knob` other than the one the incumbent runs with (its own, else the script's
    own setting `own`, else the knob's default), with a value's companions where it needs them, skipping
    configs that conflict, judged on what would run: the script's own settings under the config's."""
    own = own or {}
    current = incumbent.get(knob.name, own.get(knob.name, knob.default))
    proposals = []
    for value in knob.values:
        if value == current:
            continue
        config = _with(incumbent, knob, value, own)
        if conflicts({**own, **config}) is not None and value in knob.companions:  # e.g. 2 processes come with DDP
            config = {**config, **knob.companions[value]}
        if conflicts({**own, **config}) is None:
            proposals.append(Proposal(f"cand:{knob.name}={value}", "candidate", config, knob.stage, knob.name, value))
    return proposals


def _ratio_text(summary: Summary) -> str:
    ratio, ci = summary_ratio_text(summary)  # the digits its CI supports; a single round has no CI
    return f"{ratio} the incumbent ({ci})"


def _decide(state: GreedyState, proposal: Proposal, last: Record, comparisons: list[Record], accepted: bool,
            reason: str) -> None:
    """Record the decision on `proposal` from its comparisons (pooled), and make it the incumbent if accepted."""
    summary = summarize([r for c in comparisons for r in c.ratios])
    loads = [c.other_load_cores for c in comparisons if c.other_load_cores is not None]
    incumbent_figure = last.reference_figure
    state.decisions.append(Decision(
        proposal.stage, proposal.knob, proposal.value if accepted else None, incumbent_figure, last.figure,
        _NOISE_FLOOR, reason, value=proposal.value, ratio=summary.median, ratio_ci_low=summary.ci_low,
        ratio_ci_high=summary.ci_high, rounds=summary.n, mode=last.mode, other_load_cores=max(loads) if loads else None))
    if accepted:
        state.incumbent = proposal.config
        state.incumbent_figure = last.figure


def _not_judged(knob: KnobSpace, records: list[Record]) -> Decision:
    """The decision on a knob none of whose values could be compared: say why, value by value."""
    if all(r.status == "ok" and r.guard_ok is False for r in records):
        reason, judged = "rejected: every value failed the convergence guard", True
    else:
        statuses = ", ".join(sorted({r.status if r.status != "ok" else "guard" if r.guard_ok is False else "no round"
                                     for r in records}))
        reason, judged = f"not judged: no value could be compared ({statuses})", False
        whys = {r.error for r in records if r.status == "invalid" and r.error}
        if len(whys) == 1 and len(records) == sum(r.status == "invalid" for r in records):  # e.g. it does not apply
            reason += f": {whys.pop()}"
    return Decision(knob.stage, knob.name, None, None, None, _NOISE_FLOOR, reason, judged=judged)


def _walk(space: list[KnobSpace], replay: _Replay, conflicts) -> None:
    state = replay.state
    base, again = replay.need_all([Proposal("baseline", "baseline", {}), Proposal("baseline#2", "remeasure", {})])
    if not base.usable:
        state.failed_baseline = f"the baseline trial failed ({base.status}); nothing to compare against"
        return
    state.baseline_figure = base.figure
    state.noise_ci_floor = max(_NOISE_FLOOR, base.ci_rel or 0.0, again.ci_rel or 0.0)
    if again.usable:
        state.noise_spreads.append(_spread(base, again))
    measurements = [r for r in (base, again) if r.usable]
    state.incumbent_figure = _estimate(measurements)[0]
    stages = list(dict.fromkeys(k.stage for k in space))
    state.stage_order = order_stages(stages, base)
    for index, stage in enumerate(state.stage_order):
        if index > 0:
            remeasured = replay.need_all([Proposal(f"remeasure:{stage}", "remeasure", dict(state.incumbent), stage)])[0]
            if remeasured.usable:
                measurements.append(remeasured)
                state.incumbent_figure = _estimate(measurements)[0]
        for knob in (k for k in space if k.stage == stage):
            measurements = _decide_knob(knob, replay, conflicts, measurements)


def _estimate(measurements: list[Record]) -> tuple[float, float]:
    """(samples/s, CI half-width) of the incumbent: medians over its last three measurements.

    The median of the recent re-measurements follows real drift (a host that stays slower) within
    a stage or two, while one measurement taken during a load spike cannot move it on its own.
    """
    recent = measurements[-_RECENT_MEASUREMENTS:]
    return (statistics.median(r.figure for r in recent), statistics.median(r.ci_rel or 0.0 for r in recent))


def _decide_knob(knob: KnobSpace, replay: _Replay, conflicts, measurements: list[Record]) -> list[Record]:
    """Try every value of `knob` from the incumbent; returns the (new) incumbent's measurements."""
    state = replay.state
    proposals = _candidates(knob, state.incumbent, conflicts)
    if not proposals:
        return measurements
    records = replay.need_all(proposals)
    usable = [(r, p) for r, p in zip(records, proposals) if r.usable]
    inc_figure, inc_ci = _estimate(measurements)
    if not usable:
        state.decisions.append(_not_judged(knob, records))
        return measurements
    best, proposal = max(usable, key=lambda rp: rp[0].figure)
    threshold = max(state.noise_frac, (best.ci_rel or 0.0) + inc_ci)
    gain = best.figure / inc_figure - 1
    low, high = _CONFIRM_BAND
    unsettled = best.unsettled(state.noise_frac)
    if gain > high * threshold and unsettled is None:
        return _accept(state, proposal, [best], best.figure, inc_figure, threshold,
                       f"accepted: {gain:+.1%}, over twice the noise ({threshold:.1%})")
    if gain <= max(_NOISE_FLOOR, low * threshold):
        verdict = f"within the noise ({threshold:.1%})" if gain > 0 else "no faster"
        _reject(state, proposal, best.figure, inc_figure, threshold,
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
    inc_figure, inc_ci = _estimate(measurements)
    why = f"not settled ({unsettled})" if unsettled else f"not clear against the noise ({first_threshold:.1%})"
    first_said = f"first run {first_gain:+.1%}, {why}, so measured again"
    if not cand_again.usable:
        _reject(state, proposal, first.figure, inc_figure, first_threshold,
                f"rejected: {first_said}, and the second run failed ({cand_again.status})")
        return measurements
    state.noise_spreads.append(_spread(first, cand_again))
    runs = [first.figure, cand_again.figure]
    threshold = max(_NOISE_FLOOR, state.noise_frac / math.sqrt(2), (first.ci_rel or 0.0) + inc_ci)
    if unsettled or cand_again.unsettled(state.noise_frac):
        figure, of_two = min(runs), "the lower of two (a run was not settled)"
    else:
        figure, of_two = statistics.fmean(runs), "the mean of two"
    gain = figure / inc_figure - 1
    said = f"{first_said}: {of_two} gives {gain:+.1%} vs the noise of a mean of two ({threshold:.1%})"
    if gain > threshold:
        return _accept(state, proposal, [first, cand_again], figure, inc_figure, threshold, f"accepted: {said}")
    _reject(state, proposal, figure, inc_figure, threshold, f"rejected: {said}")
    return measurements


def _accept(state: GreedyState, proposal: Proposal, runs: list[Record], figure: float, inc_figure: float, threshold: float,
            reason: str) -> list[Record]:
    """Make `proposal` the incumbent, at `figure` (its one run, or the mean of its runs); returns its measurements."""
    state.incumbent = proposal.config
    state.incumbent_figure = figure
    state.decisions.append(Decision(proposal.stage, proposal.knob, proposal.value, inc_figure, figure, threshold, reason))
    return runs


def _reject(state: GreedyState, proposal: Proposal, best_figure: float, inc_figure: float, threshold: float, reason: str) -> None:
    state.decisions.append(Decision(proposal.stage, proposal.knob, None, inc_figure, best_figure, threshold, reason))


def _with(config: dict, knob: KnobSpace, value: object, own: dict | None = None) -> dict:
    """`config` with `knob` = `value`: left out when that is the default and the script's own setting (`own`)
    is the default too, else set (a script's own 2 workers need `data.num_workers = 0` said)."""
    merged = dict(config)
    if value == knob.default and (own or {}).get(knob.name, knob.default) == knob.default:
        merged.pop(knob.name, None)
    else:
        merged[knob.name] = value
    return merged


def _spread(first: Record, second: Record) -> float:
    """The relative spread of two runs of one config (one sample of the noise)."""
    return abs(first.figure - second.figure) / min(first.figure, second.figure)
