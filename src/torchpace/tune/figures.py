"""The one definition of each figure a tune reports (pure), used by `torchpace.toml` [result], the
terminal table, `--json` and the HTML report alike.

Greedy studies decide by paired comparisons (`torchpace.tune.policy`):

- each decision's figure is its comparison's ratio, candidate / incumbent: the median of the rounds'
  ratios with its 95% CI (pooled over both comparisons of a confirmed decision), and each arm's
  samples/s is that arm's median over its turns in the comparison;
- the speedup is the tuned config compared with the defaults the same way (the `final` comparison),
  and the baseline and tuned samples/s shown beside it are the two arms of that comparison; before
  it has run (a budget cut), the speedup is the product of the accepted steps' ratios, and says so;
- when other processes' load was material during a decision, a note says so next to it, naming the
  compared knobs whose gains depend on free cores (`Knob.shares_cores`).

Other strategies, and greedy studies tuned before paired comparisons, measure each config alone:

- A config's samples/s is the median of every measured window of all its usable trials (status ok,
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

import statistics
from typing import Any, Mapping, Sequence

from torchpace.measure.contention import is_material
from torchpace.measure.stats import summarize

FIGURES_NOTE = ("Figures: a config's samples/s is the median of every measured window of all its ok trials, "
                "with the 95% CI of that median; speedup = tuned / baseline samples/s, as shown.")
PAIRED_FIGURES_NOTE = ("Figures: every decision compared two configs in alternation (two processes taking turns on the "
                       "host); a ratio is the median of the rounds' ratios, with its 95% CI. The speedup is the tuned "
                       "config compared with the defaults the same way; each samples/s is that config's median over "
                       "its turns in the comparison shown.")
SPEEDUP_FROM_FINAL = "the tuned config compared with the defaults in alternation"
SPEEDUP_FROM_STEPS = "the product of the accepted steps' ratios (the final comparison with the defaults did not run)"


def is_usable(row: Mapping[str, Any]) -> bool:
    """A trial row whose figure counts: finished ok, guard not failed, with a samples/s figure."""
    return row.get("status") == "ok" and row.get("guard") != "fail" and bool(row.get("samples_per_s"))


def config_figure(rows: Sequence[Mapping[str, Any]], config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The samples/s of `config` over every usable trial of exactly that config (None when none).

    Returns:
        `samples_per_s` (median of the pooled windows), `samples_per_s_ci_low` / `_ci_high` (95% CI of
        that median), `ci_rel_halfwidth`, `trials` and `windows` (how many were pooled).
    """
    runs = [r for r in rows if is_usable(r) and dict(r.get("config") or {}) == dict(config)]
    windows = [w for r in runs for w in (r.get("window_samples_per_s") or [r["samples_per_s"]])]
    if not windows:
        return None
    summary = summarize(windows)
    return {"samples_per_s": summary.median, "samples_per_s_ci_low": summary.ci_low,
            "samples_per_s_ci_high": summary.ci_high, "ci_rel_halfwidth": summary.ci_rel_halfwidth,
            "trials": len(runs), "windows": len(windows)}


def with_figure(row: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """`row` (one trial of a config) with its figures replaced by the config's pooled figure."""
    if row is None:
        return None
    figure = config_figure(rows, row.get("config") or {})
    return {**row, **figure, "objective_value": figure["samples_per_s"]} if figure else dict(row)


def speedup(tuned: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None) -> float | None:
    """tuned / baseline samples/s, as shown (None without both)."""
    if not tuned or not baseline or not baseline.get("samples_per_s") or not tuned.get("samples_per_s"):
        return None
    return tuned["samples_per_s"] / baseline["samples_per_s"]


def other_load_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Other processes' CPU use over the tune's trials (`torchpace.measure.contention`), with the sentence
    to show when it was material (in any trial); None when no trial recorded it."""
    loads = [r["other_load_cores"] for r in rows if r.get("other_load_cores") is not None]
    if not loads:
        return None
    usable = max((r.get("usable_cores") or 1 for r in rows), default=1)
    median, peak = statistics.median(loads), max(loads)
    note = None
    if is_material(peak, usable):
        note = (f"tuned while other processes used {median:.1f} of {usable} cores (median over {len(loads)} trials, "
                f"up to {peak:.1f}): the result reflects that contention")
    return {"median_cores": median, "max_cores": peak, "trials": len(loads), "usable_cores": usable, "note": note}


def result_table(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of torchpace.toml's [result], from a `TuneOutcome.to_dict()` (the ones the table shows)."""
    baseline, best = outcome["baseline"], outcome["best"]
    extras = outcome.get("extras") or {}
    load = extras.get("other_load") or {}
    table = {"baseline_samples_per_s": baseline["samples_per_s"],
             "baseline_ci_low": baseline.get("samples_per_s_ci_low"), "baseline_ci_high": baseline.get("samples_per_s_ci_high"),
             "tuned_samples_per_s": best["samples_per_s"],
             "tuned_ci_low": best.get("samples_per_s_ci_low"), "tuned_ci_high": best.get("samples_per_s_ci_high"),
             "speedup": outcome["speedup"], "figures": extras.get("figures"),
             "other_load_cores": load.get("median_cores"), "other_load_note": load.get("note")}
    speedup_cmp = extras.get("speedup") or {}
    for key in ("speedup_ci_low", "speedup_ci_high", "speedup_rounds", "speedup_from", "speedup_mode"):
        table[key] = speedup_cmp.get(key)
    if speedup_cmp.get("speedup_from") == SPEEDUP_FROM_FINAL:
        table["final_other_load_note"] = speedup_cmp.get("load_note")
    table["decisions"] = [_drop_none(decision_row(d)) for d in extras.get("decisions") or [] if d.get("ratio") is not None]
    return {key: value for key, value in table.items() if value not in (None, [])}  # TOML has no null


def decision_row(decision: Mapping[str, Any]) -> dict[str, Any]:
    """One decision as every output lists it: knob, the value judged, kept or not, the ratio with its CI."""
    return {"knob": decision["knob"], "value": decision.get("value"), "kept": decision.get("accepted_value") is not None,
            "ratio": decision.get("ratio"), "ratio_ci_low": decision.get("ratio_ci_low"),
            "ratio_ci_high": decision.get("ratio_ci_high"), "rounds": decision.get("rounds"), "mode": decision.get("mode"),
            "other_load_cores": decision.get("other_load_cores"), "note": decision.get("load_note"),
            "reason": decision.get("reason")}


def _drop_none(table: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in table.items() if value is not None}


def comparison(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The paired comparison of a trial row (None for a trial measured alone, or one without a ratio):
    ratio, its CI and rounds, how it ran, and the reference arm's figure."""
    pair = (row or {}).get("pair") or {}
    if pair.get("ratio") is None:
        return None
    return {"ratio": pair["ratio"], "ratio_ci_low": pair.get("ratio_ci_low"), "ratio_ci_high": pair.get("ratio_ci_high"),
            "rounds": pair.get("rounds"), "mode": pair.get("mode"), "mode_reason": pair.get("mode_reason"),
            "reference_samples_per_s": pair.get("reference_value")}


def load_note(other_load_cores: float | None, usable_cores: int | float, knobs: Sequence[str]) -> str | None:
    """The note beside a decision taken while other processes' load was material (None otherwise), naming
    those of `knobs` whose gains depend on free cores."""
    from torchpace.knobs import REGISTRY
    from torchpace.measure.contention import decision_note

    core_knobs = [name for name in knobs if name in REGISTRY and REGISTRY[name].shares_cores]
    return decision_note(other_load_cores, usable_cores, core_knobs)


def paired_speedup(final: Mapping[str, Any] | None, accepted: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The speedup of a paired study: the final comparison's ratio with its CI, else the product of the
    accepted steps' ratios (no CI), else 1 (nothing was kept)."""
    final_cmp = comparison(final)
    if final_cmp is not None:
        return {"speedup": final_cmp["ratio"], "speedup_ci_low": final_cmp["ratio_ci_low"],
                "speedup_ci_high": final_cmp["ratio_ci_high"], "speedup_rounds": final_cmp["rounds"],
                "speedup_from": SPEEDUP_FROM_FINAL, "speedup_mode": final_cmp["mode"]}
    product = 1.0
    for change in accepted:
        product *= change["step_gain"]
    return {"speedup": product, "speedup_ci_low": None, "speedup_ci_high": None, "speedup_rounds": None,
            "speedup_from": SPEEDUP_FROM_STEPS if accepted else "nothing was kept", "speedup_mode": None}
