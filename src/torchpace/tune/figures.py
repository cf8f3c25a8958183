"""The one definition of each figure a tune reports (pure), used by `torchpace.toml` [result], the
terminal table, `--json` and the HTML report alike.

Every figure is an `Objective`: a median with its 95% CI, in the unit the study measured (samples/s,
or steps/s for a script whose samples per step are unknown; batch-1 p50 in seconds under
`--objective latency`), so no output can label one unit as another.

Greedy studies decide by paired comparisons (`torchpace.tune.policy`):

- each decision's figure is its comparison's ratio, candidate / incumbent: the median of the rounds'
  ratios with its 95% CI (pooled over both comparisons of a confirmed decision), and each arm's
  figure is that arm's median over its turns in the comparison;
- the speedup is the tuned config compared with the defaults the same way (the `final` comparison, the
  tuned config in a fresh process: the one a decision kept was more likely a fast one), and the
  baseline and tuned figures shown beside it are the two arms of that comparison; before it has run
  (a budget cut), the speedup is the product of the accepted steps' ratios, and says so;
- the baseline's and the tuned figure's interval is the range of every measurement of that config in
  the study (`config_range`), not one process's CI: on a shared host two processes of one config, or
  one process a minute apart, measure several percent apart, which is what a fresh run may see;
- when other processes' load was material during a decision, a note says so next to it, naming the
  compared knobs whose gains depend on free cores (`Knob.shares_cores`).

Other strategies, and greedy studies tuned before paired comparisons, measure each config alone:

- A config's figure is the median of every measured window of all its usable trials (status ok,
  guard not failed) pooled together, and its CI is the 95% confidence interval of that median
  (`measure.stats.summarize`): the figure always lies inside its own CI, and one config has one
  figure and one CI wherever it is shown.
- The baseline is that figure for the defaults; the tuned figure is that figure for the tuned config.
- Each accepted change's figure is that of the config after it; its step gain is its figure over the
  previous row's, and the speedup is figure / baseline, exactly the ratio of the two numbers shown.

The greedy policy decides on its own estimates (each decision's reason states them); these figures
are what is reported, after the fact, from every measurement taken.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Protocol, Sequence

from torchpace.knobs import REGISTRY
from torchpace.measure.contention import decision_note, host_change, is_material
from torchpace.measure.result import SAMPLES_PER_S, Objective
from torchpace.measure.stats import summarize
from torchpace.tune.attrs import PairRecord
from torchpace.tune.policy import Decision

SPEEDUP_FROM_FINAL = "the tuned config compared with the defaults in alternation"
SPEEDUP_FROM_STEPS = "the product of the accepted steps' ratios (the final comparison with the defaults did not run)"
SPEEDUP_FROM_NOTHING = "nothing was kept"


def figures_note(unit: str = SAMPLES_PER_S) -> str:
    """How the figures of a study measured alone are defined, in its unit."""
    return (f"Figures: a config's {unit} is the median of every measured window of all its ok trials, "
            f"with the 95% CI of that median; speedup = tuned / baseline {unit}, as shown.")


def paired_figures_note(unit: str = SAMPLES_PER_S) -> str:
    """How the figures of a study decided by paired comparisons are defined, in its unit."""
    return ("Figures: every decision compared two configs in alternation (two processes taking turns on the "
            "host); a ratio is the median of the rounds' ratios, with its 95% CI (on fewer than 6 rounds, the "
            "coverage that CI has is named). The speedup is the tuned "
            "config, in a process of its own (not one a decision kept), compared with the defaults the same way. "
            f"The baseline's and the tuned {unit} are each config's median over its turns in that comparison, "
            "shown with the range of every measurement of the config in the study (from the lowest to the highest "
            "95% CI bound of every process and comparison that measured it): where a fresh run of it has been seen "
            f"to land, which one process's CI does not cover. Each change's {unit} is its median over its turns in "
            "the comparison that decided it, with its 95% CI.")


FIGURES_NOTE = figures_note()
PAIRED_FIGURES_NOTE = paired_figures_note()


class Measured(Protocol):
    """What the figures read of a trial row (`torchpace.tune.outcome.TrialRow`)."""

    status: str
    guard: str | None
    config: Any
    throughput: Objective | None
    window_rates: tuple[float, ...]
    other_load_cores: float | None
    usable_cores: int | None


def is_usable(row: Measured) -> bool:
    """A trial row whose figure counts: finished ok, guard not failed, with a throughput figure."""
    return row.status == "ok" and row.guard != "fail" and bool(row.throughput and row.throughput.value)


@dataclass(frozen=True)
class PooledFigure:
    """A config's figure over every usable trial of it (see the module docstring).

    Attributes:
        figure: the median of the pooled windows with the 95% CI of that median.
        trials: trials pooled.
        windows: windows pooled.
    """

    figure: Objective
    trials: int
    windows: int


def config_figure(rows: Sequence[Measured], config: Any) -> PooledFigure | None:
    """The figure of `config` over every usable trial of exactly that config (None when none)."""
    runs = [r for r in rows if is_usable(r) and dict(r.config or {}) == dict(config)]
    windows = [w for r in runs for w in (r.window_rates or (r.throughput.value,))]
    if not windows:
        return None
    summary = summarize(windows)
    figure = replace(runs[0].throughput, value=summary.median, ci_low=summary.ci_low, ci_high=summary.ci_high,
                     ci_rel_halfwidth=summary.ci_rel_halfwidth)
    return PooledFigure(figure, len(runs), len(windows))


class ArmMeasured(Measured, Protocol):
    """What `config_range` reads of a row of a paired study: a comparison's arm A besides its own arm B."""

    reference: Any
    pair: PairRecord | None
    objective: Objective | None


def _scores_of(config: Mapping[str, Any], rows: Sequence[ArmMeasured]) -> list[float]:
    """Every score (the study's objective, "higher is better") of `config` the rows measured: each usable row of
    it, and each comparison's reference arm of it that ended ok."""
    scores = [row.objective.score for row in rows if is_usable(row) and dict(row.config or {}) == config and row.objective]
    scores += [row.pair.reference_value for row in rows if row.pair is not None and row.reference is not None
               and dict(row.reference) == config and row.pair.reference_status == "ok"]
    return [score for score in scores if score]


def config_measurements(rows: Sequence[ArmMeasured], config: Any) -> list[Objective]:
    """Every figure of `config` a paired study measured, each from one process over one stretch of time: its
    trials alone (the baseline), and every comparison's arm of it (B: the row's usable figure; A: the
    reference arm's, when that arm ended ok), in trial order."""
    figures: list[Objective | None] = []
    for row in rows:
        if is_usable(row) and dict(row.config or {}) == dict(config):
            figures.append(row.throughput)
        pair = row.pair
        if (pair is not None and row.reference is not None and dict(row.reference) == dict(config)
                and pair.reference_status == "ok" and pair.reference_bench is not None):
            figures.append(pair.reference_bench.objective)
    return [f for f in figures if f is not None and f.value and f.ci_low is not None and f.ci_high is not None]


@dataclass(frozen=True)
class RangeFigure:
    """A config's figure whose interval spans every measurement of it (see `config_range`).

    Attributes:
        figure: the shown figure, its value kept, its interval from the lowest to the highest CI bound.
        measurements: the measurements spanned (the shown figure's own among them).
    """

    figure: Objective
    measurements: int


def range_name(measurements: int) -> str:
    """What every output calls the interval of `config_range`: `range of 4 measurements`."""
    return f"range of {measurements} measurement{'s' if measurements != 1 else ''}"


def config_range(figure: Objective, rows: Sequence[ArmMeasured], config: Any) -> RangeFigure:
    """`figure` (one arm of `config` in the final comparison) with an interval that spans every measurement of
    `config` in the study (`config_measurements`): from the lowest to the highest bound of their 95% CIs.

    One process's CI bounds that process's median over its turns; another process of the same config, or the
    same one a minute later, can measure several percent off it on a shared host (and a process that a
    decision kept was more likely a fast one). The range of every process and stretch of time the tune
    measured is where a fresh run of the config has been seen to land."""
    measured = config_measurements(rows, config)
    spanned = measured if figure in measured or figure.ci_low is None else [figure, *measured]
    if not spanned:
        return RangeFigure(figure, 0)
    low, high = min(f.ci_low for f in spanned), max(f.ci_high for f in spanned)
    rel = (high - low) / 2 / figure.value if figure.value else None
    return RangeFigure(replace(figure, ci_low=low, ci_high=high, ci_rel_halfwidth=rel), len(spanned))


def speedup(tuned: Objective | None, baseline: Objective | None) -> float | None:
    """tuned / baseline, as shown (None without both)."""
    if not tuned or not baseline or not tuned.value or not baseline.value:
        return None
    return tuned.value / baseline.value if tuned.higher_is_better else baseline.value / tuned.value


def at_score(figure: Objective | None, score: float | None) -> Objective | None:
    """`figure` at the "higher is better" value `score` (a policy estimate: the mean of two runs, an arm's
    median over its turns), its CI kept. At its own score it is itself: a latency's 1 / (1 / p50) can differ
    from p50 in the last digit, and a figure shown twice must read the same."""
    if figure is None or score is None or score == figure.score:
        return figure
    return replace(figure, value=score if figure.higher_is_better else 1.0 / score)


@dataclass(frozen=True)
class OtherLoad:
    """Other processes' CPU use over a tune's trials (`torchpace.measure.contention`).

    Attributes:
        median_cores: the median over the trials that recorded it (`max_cores`: the most).
        trials: trials that recorded it.
        usable_cores: the cores this host gives torchpace.
        note: the sentence to show when it was material in any trial (None otherwise).
    """

    median_cores: float
    max_cores: float
    trials: int
    usable_cores: int
    note: str | None = None


def other_load_summary(rows: Sequence[Measured]) -> OtherLoad | None:
    """Other processes' CPU use over the tune's trials; None when no trial recorded it."""
    loads = [r.other_load_cores for r in rows if r.other_load_cores is not None]
    if not loads:
        return None
    usable = max((r.usable_cores or 1 for r in rows), default=1)
    median, peak = statistics.median(loads), max(loads)
    note = None
    if is_material(peak, usable):
        note = (f"tuned while other processes used {median:.1f} of {usable} cores (median over {len(loads)} trials, "
                f"up to {peak:.1f}): the result reflects that contention")
    return OtherLoad(median, peak, len(loads), usable, note)


@dataclass(frozen=True)
class ComparisonFigure:
    """The paired comparison of a trial: the ratio with its 95% CI and rounds, and how it ran."""

    ratio: float
    ratio_ci_low: float | None
    ratio_ci_high: float | None
    rounds: int | None
    mode: str | None
    mode_reason: str | None = None


def comparison(pair: PairRecord | None) -> ComparisonFigure | None:
    """A trial's comparison (None for a trial measured alone, or one without a ratio)."""
    if pair is None or pair.ratio is None:
        return None
    return ComparisonFigure(pair.ratio, pair.ratio_ci_low, pair.ratio_ci_high, pair.rounds, pair.mode, pair.mode_reason)


def load_note(other_load_cores: float | None, usable_cores: int | float, knobs: Sequence[str]) -> str | None:
    """The note beside a decision taken while other processes' load was material (None otherwise), naming
    those of `knobs` whose gains depend on free cores."""
    return decision_note(other_load_cores, usable_cores, _core_knobs(knobs))


def _core_knobs(knobs: Sequence[str]) -> list[str]:
    """Those of `knobs` whose gains depend on the cores free (threads, workers, ranks)."""
    return [name for name in knobs if name in REGISTRY and REGISTRY[name].shares_cores]


def host_change_note(deciding: Sequence[ArmMeasured], rows: Sequence[ArmMeasured], knobs: Sequence[str],
                     reference: str = "the incumbent") -> str | None:
    """The note beside a decision on `knobs` whose gains depend on free cores (`reference` names the arm its
    comparisons measured it against; the final comparison's is the defaults) when a `deciding` comparison's
    reference arm scored `measure.contention.HOST_CHANGE` times as high or as low as the median of its config's other measurements in
    the study, by the study's objective (None otherwise, or when it has none).

    Other processes' load is not all a host can change: on a VM the physical cores' other tenants, which no
    process of this machine shows, can slow a step with two intra-op threads by half for tens of seconds while one
    thread keeps its speed (measured: batch-1 calls of `inference` at 0.65 ms, then 1.0 ms with two threads, 0.81
    ms with one throughout). Turns pair away a change that both arms feel alike, not one that depends on the knob
    compared, so such a gain is real for the host at that time and is said to be."""
    core_knobs = _core_knobs(knobs)
    if not core_knobs:
        return None
    worst: tuple[float, int] | None = None
    for row in deciding:
        pair = row.pair
        if pair is None or row.reference is None or pair.reference_status != "ok" or not pair.reference_value:
            continue
        others = _scores_of(dict(row.reference), [r for r in rows if r is not row])
        change = host_change(pair.reference_value, others)
        if change is not None and (worst is None or abs(math.log(change)) > abs(math.log(worst[0]))):
            worst = (change, len(others))
    if worst is None:
        return None
    change, others = worst
    pace = f"{1 - change:.0%} slower" if change < 1 else f"{change - 1:.0%} faster"
    return (f"measured while {reference} ran {pace} than in its {others} other measurement{'s' if others != 1 else ''} "
            f"of this study, though no other process's load was material: the host changed (on a virtual machine, other "
            f"tenants of its cores can); gains of {', '.join(core_knobs)} may not hold at another time")


@dataclass(frozen=True)
class SpeedupFigure:
    """The speedup of a paired study, and where it comes from.

    Attributes:
        value: the final comparison's ratio, tuned / defaults, else the product of the accepted steps' ratios.
        ci_low: its 95% CI (`ci_high`; None for a product of steps).
        rounds: the final comparison's rounds.
        source: `SPEEDUP_FROM_FINAL`, `SPEEDUP_FROM_STEPS` or `SPEEDUP_FROM_NOTHING`.
        mode: how the final comparison ran.
        load_note: said when other processes' load was material during the final comparison.
    """

    value: float
    ci_low: float | None
    ci_high: float | None
    rounds: int | None
    source: str
    mode: str | None
    load_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As `--json`'s `extras.speedup` and torchpace.toml's [result] name it."""
        return {"speedup": self.value, "speedup_ci_low": self.ci_low, "speedup_ci_high": self.ci_high,
                "speedup_rounds": self.rounds, "speedup_from": self.source, "speedup_mode": self.mode,
                "load_note": self.load_note}


def paired_speedup(final: PairRecord | None, step_gains: Sequence[float]) -> SpeedupFigure:
    """The speedup of a paired study: the final comparison's ratio with its CI, else the product of the
    accepted steps' ratios (no CI), else 1 (nothing was kept)."""
    final_cmp = comparison(final)
    if final_cmp is not None:
        return SpeedupFigure(final_cmp.ratio, final_cmp.ratio_ci_low, final_cmp.ratio_ci_high, final_cmp.rounds,
                             SPEEDUP_FROM_FINAL, final_cmp.mode)
    product = 1.0
    for gain in step_gains:
        product *= gain
    return SpeedupFigure(product, None, None, None, SPEEDUP_FROM_STEPS if step_gains else SPEEDUP_FROM_NOTHING, None)


def result_table(outcome: Any) -> dict[str, Any]:
    """The figures of torchpace.toml's [result], from a `TuneOutcome` (the ones the table shows).

    Figures are named in their unit: `baseline_samples_per_s`, or `baseline_steps_per_s` in a study
    measured in steps/s (`unit` says which).
    """
    baseline, best = outcome.baseline.throughput, outcome.best.throughput
    rate = "steps_per_s" if baseline is not None and baseline.unit != SAMPLES_PER_S else "samples_per_s"
    load = outcome.other_load
    table = {"unit": baseline.unit if baseline else None,
             f"baseline_{rate}": baseline.value if baseline else None,
             "baseline_ci_low": baseline.ci_low if baseline else None, "baseline_ci_high": baseline.ci_high if baseline else None,
             f"tuned_{rate}": best.value if best else None,
             "tuned_ci_low": best.ci_low if best else None, "tuned_ci_high": best.ci_high if best else None,
             # a paired study's: the measurements those intervals span (`config_range`: a range, not a CI)
             "baseline_measurements": outcome.baseline.measurements or None if outcome.baseline else None,
             "tuned_measurements": outcome.best.measurements or None if outcome.best else None,
             "speedup": outcome.speedup, "figures": outcome.figures_note,
             "other_load_cores": load.median_cores if load else None, "other_load_note": load.note if load else None,
             # a script's: what its baseline ran with (its own DataLoader and optimizer settings)
             "baseline_settings": dict(outcome.script_settings) if outcome.script_settings else None}
    speedup_figure = outcome.speedup_figure
    if speedup_figure is not None:
        table.update({k: v for k, v in speedup_figure.to_dict().items() if k not in ("speedup", "load_note")})
        if speedup_figure.source == SPEEDUP_FROM_FINAL:
            table["final_other_load_note"] = speedup_figure.load_note
    # every decision, those without a comparison's ratio too (every value failed the guard, or none could run)
    table["decisions"] = [_drop_none(d.row()) for d in outcome.decisions]
    if outcome.run_on is not None:  # script mode: the kept config's run past its measured steps
        table.update(run_on=outcome.run_on.run.status, run_on_note=outcome.run_on.describe())
        if outcome.run_on.culprit:
            table["run_on_taken_back"] = outcome.run_on.culprit
    return {key: value for key, value in table.items() if value not in (None, [])}  # TOML has no null


@dataclass(frozen=True)
class ReportedDecision:
    """A decision of the greedy policy as every output lists it: the decision, and the note beside it when
    other processes' load was material during its comparison."""

    decision: Decision
    load_note: str | None = None

    def row(self) -> dict[str, Any]:
        """Knob, the value judged, kept or not, the ratio with its CI (`[[result.decisions]]`)."""
        d = self.decision
        return {"knob": d.knob, "value": d.value, "kept": d.accepted_value is not None, "ratio": d.ratio,
                "ratio_ci_low": d.ratio_ci_low, "ratio_ci_high": d.ratio_ci_high, "rounds": d.rounds, "mode": d.mode,
                "other_load_cores": d.other_load_cores, "note": self.load_note, "reason": d.reason}

    def to_dict(self) -> dict[str, Any]:
        """As `--json`'s `extras.decisions[]`: every field of the decision, and `load_note`."""
        return {**asdict(self.decision), "load_note": self.load_note}


def _drop_none(table: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in table.items() if value is not None}
