"""The one definition of each figure a tune reports (pure), used by `torchpace.toml` [result], the
terminal table, `--json` and the HTML report alike.

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
    return {key: value for key, value in table.items() if value is not None}  # TOML has no null
