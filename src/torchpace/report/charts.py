"""Charts for the HTML report: plain data in, one SVG string out, ready to inline in the page.

Figures are drawn on `matplotlib.figure.Figure` (no pyplot, so no global backend or figure
registry) inside `matplotlib.rc_context`, which puts matplotlib's settings back afterwards. Text
stays text (`svg.fonttype = "none"`), so it is sharp in print and searchable in the browser.

`clean_svg` makes matplotlib's output safe to inline: it drops the XML prolog, the DOCTYPE and the
metadata block (the only places that name outside URLs), the namespace declarations (HTML does not
need them), and the fixed width and height (the viewBox scales with the page); it prefixes every
id with the chart's name so several charts can share one HTML document.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any, Callable, Mapping, Sequence

from torchpace.measure.render import DEFAULTS
from torchpace.measure.result import BenchResult, Objective
from torchpace.report.view import is_failed, trial_label, trial_stage
from torchpace.tune.outcome import AcceptedChange, TrialRow

# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies and in greyscale print.
STAGE_COLOURS = {"baseline": "#7a7a7a", "system": "#CC79A7", "data": "#0072B2", "compute": "#E69F00",
                 "memory": "#009E73", "distributed": "#56B4E9", "search": "#0072B2"}
FAIL_COLOUR = "#D55E00"
TUNED_COLOUR = "#0072B2"
GAIN_COLOUR = "#009E73"
PHASE_COLOURS = {"input_wait": "#D55E00", "h2d": "#E69F00", "forward": "#0072B2", "backward": "#56B4E9",
                 "optimizer": "#009E73", "other": "#BBBBBB"}
PHASE_TITLES = {"input_wait": "input wait", "h2d": "host→device copy", "forward": "forward + loss",
                "backward": "backward", "optimizer": "optimizer", "other": "other"}

_WIDTH_IN = 10.0  # drawn 10 in wide; the page scales the SVG to its column
_LOG_SCALE_RATIO = 20.0  # figures spanning more than 20x go on a log axis, so the small ones stay visible
_MIN_WATERFALL_SLOTS = 5  # a waterfall with fewer bars keeps this much room, so two bars do not fill the page
_MAX_TICK_LABELS = 40  # beyond this many trials, ticks show trial numbers only
_SEGMENT_LABEL_FRAC = 0.07  # a stacked-bar segment narrower than 7% of the step gets no label inside
_RC = {
    "svg.fonttype": "none", "font.family": "sans-serif", "font.size": 9, "axes.titlesize": 10,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.35,
    "axes.axisbelow": True, "legend.frameon": False,
}


# ---- SVG plumbing -----------------------------------------------------------------------------------


def render_figure_svg(name: str, title: str, height_in: float, draw: Callable[[Any], None]) -> str:
    """Draw a figure with `draw(fig)` and return it as inline-ready SVG.

    Args:
        name: the chart's id prefix (letters, digits, dashes).
        title: the SVG's accessible title.
        height_in: figure height in inches (width is fixed).
        draw: fills the matplotlib Figure.
    """
    # lazy: matplotlib loads only when a chart is drawn
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context({**_RC, "svg.hashsalt": name}):
        fig = Figure(figsize=(_WIDTH_IN, height_in), layout="constrained")
        draw(fig)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return clean_svg(buffer.getvalue(), name, title)


def clean_svg(svg: str, prefix: str, title: str) -> str:
    """matplotlib's SVG document as an element to inline in HTML (see the module docstring)."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(?::\w+)?="[^"]*"', "", svg)
    svg = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', svg)
    svg = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", svg)
    head_end = svg.index(">")
    head = re.sub(r'\s(?:width|height)="[^"]*"', "", svg[:head_end])
    safe_title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    return (f'{head} class="chart-svg" role="img" aria-label="{safe_title}">'
            f"<title>{safe_title}</title>{svg[head_end + 1:]}").strip()


# ---- tune -------------------------------------------------------------------------------------------


def _ci_err(figures: Sequence[Objective]) -> list[list[float]]:
    """Asymmetric error-bar lengths [below, above] from each figure's 95% CI (0 where unknown)."""
    below = [max(0.0, f.value - f.ci_low) if f.ci_low is not None else 0.0 for f in figures]
    above = [max(0.0, f.ci_high - f.value) if f.ci_high is not None else 0.0 for f in figures]
    return [below, above]


def render_speed_svg(baseline: Objective, tuned: Objective | None, interval: str = "95% CI",
                     baseline_label: str = DEFAULTS) -> str:
    """Baseline vs tuned figures (samples/s, or steps/s) as horizontal bars with their interval (`interval`
    names it: their 95% CI, or a paired study's range of every measurement of each config); `baseline_label`
    says what the baseline ran (PyTorch's defaults, or a script's own settings)."""
    rows = [(f"baseline ({baseline_label})", baseline, STAGE_COLOURS["baseline"])]
    if tuned is not None:
        rows.append(("tuned", tuned, TUNED_COLOUR))

    def draw(fig) -> None:
        ax = fig.add_subplot()
        ys = list(range(len(rows)))[::-1]
        ax.barh(ys, [figure.value for _, figure, _ in rows], color=[c for _, _, c in rows], height=0.55)
        ax.set_yticks(ys, [label for label, _, _ in rows])
        for y, (_, figure, _) in zip(ys, rows):
            low, high = figure.ci_low, figure.ci_high
            if low is not None and high is not None:  # the interval as measured, even where the figure is an estimate outside it
                ax.errorbar((low + high) / 2, y, xerr=(high - low) / 2, fmt="none", capsize=5, elinewidth=1.2, ecolor="#222222")
            ax.annotate(f"{figure.value:,.{_digits(figure.value)}f}", (max(figure.value, high or 0), y), xytext=(6, 0),
                        textcoords="offset points", va="center", fontsize=9)
        ax.set_xlabel(f"{baseline.unit} (median; bars: {interval})")
        ax.set_xlim(0, max(figure.ci_high or figure.value for _, figure, _ in rows) * 1.18)
        ax.grid(axis="y", visible=False)

    return render_figure_svg("speed", f"Baseline and tuned {baseline.unit} with 95% confidence intervals",
                             0.6 + 0.55 * len(rows), draw)


def render_waterfall_svg(accepted: Sequence[AcceptedChange], speedup: float) -> str:
    """Cumulative speedup over the baseline, one floating bar per accepted knob, then the total."""
    labels = ["baseline"] + [f"+ {a.knob}\n= {a.value}" for a in accepted] + ["tuned"]

    def draw(fig) -> None:
        ax = fig.add_subplot()
        previous = 1.0
        ax.bar(0, 1.0, color=STAGE_COLOURS["baseline"], width=0.6)
        ax.annotate("1.00×", (0, 1.0), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=9)
        for x, step in enumerate(accepted, start=1):
            low, high = sorted((previous, step.speedup))
            colour = GAIN_COLOUR if step.speedup >= previous else FAIL_COLOUR
            ax.bar(x, high - low, bottom=low, color=colour, width=0.6)
            ax.annotate(f"{step.speedup:.2f}×\n({step.step_gain - 1:+.0%})", (x, high), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize=8)
            ax.plot([x - 1.3, x + 0.3], [previous, previous], color="#555555", linewidth=0.8, linestyle=":")
            previous = step.speedup
        last = len(labels) - 1
        ax.bar(last, speedup, color=TUNED_COLOUR, width=0.6)
        ax.annotate(f"{speedup:.2f}×", (last, speedup), xytext=(0, 3), textcoords="offset points", ha="center",
                    fontsize=9, fontweight="bold")
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        pad = max(0.0, (_MIN_WATERFALL_SLOTS - len(labels)) / 2)
        ax.set_xlim(-0.6 - pad, last + 0.6 + pad)
        ax.set_ylabel("speedup vs baseline (×)")
        ax.set_ylim(0, max(1.0, speedup, *(a.speedup for a in accepted)) * 1.22)
        ax.grid(axis="x", visible=False)
        if not accepted:
            ax.text(0.5, 0.92, "no change beat the measured noise", transform=ax.transAxes, ha="center", fontsize=9,
                    color="#444444")

    return render_figure_svg("waterfall", "Cumulative speedup per accepted knob", 2.8, draw)


def render_trials_svg(trials: Sequence[TrialRow], baseline: Objective | None, unit: str) -> str:
    """Every trial's figure (in the study's `unit`) with its 95% CI, in trial order, coloured by stage; failures marked."""
    measured = [t for t in trials if not is_failed(t)]
    values = [t.throughput.value for t in measured]
    log = bool(values) and max(values) / min(values) > _LOG_SCALE_RATIO

    def draw(fig) -> None:
        ax = fig.add_subplot()
        for stage in dict.fromkeys(trial_stage(t) for t in measured):
            group = [t for t in measured if trial_stage(t) == stage]
            passed = [t for t in group if t.guard != "fail"]
            if passed:
                ax.errorbar([t.number for t in passed], [t.throughput.value for t in passed],
                            yerr=_ci_err([t.throughput for t in passed]), fmt="o",
                            color=STAGE_COLOURS.get(stage, "#333333"), capsize=3, markersize=6, label=stage)
            rejected = [t for t in group if t.guard == "fail"]
            if rejected:
                ax.errorbar([t.number for t in rejected], [t.throughput.value for t in rejected],
                            yerr=_ci_err([t.throughput for t in rejected]), fmt="o", markerfacecolor="white",
                            color=STAGE_COLOURS.get(stage, "#333333"), markeredgecolor=FAIL_COLOUR, capsize=3,
                            markersize=7, label=f"{stage}: guard failed")
        _mark_failures(ax, [t for t in trials if t.status != "ok"])
        if baseline is not None and baseline.value:
            ax.axhline(baseline.value, color=STAGE_COLOURS["baseline"], linestyle="--", linewidth=1,
                       label="baseline median")
        _trial_axes(ax, trials, log, unit)
        fig.legend(loc="outside upper center", ncols=4, fontsize=8)

    return render_figure_svg("trials", f"{unit.capitalize()} of every trial in order, with 95% confidence intervals", 4.2,
                             draw)


def _mark_failures(ax, failed: Sequence[TrialRow]) -> None:
    """A red cross at the bottom of the axes for each failed trial, with its failure class."""
    if not failed:
        return
    transform = ax.get_xaxis_transform()  # x in data, y in axes fraction
    ax.scatter([t.number for t in failed], [0.04] * len(failed), marker="X", s=60, color=FAIL_COLOUR,
               transform=transform, label="failed (class below)", zorder=3)
    for t in failed:
        ax.annotate(t.status, (t.number, 0.04), xycoords=transform, xytext=(0, 8), textcoords="offset points",
                    ha="center", fontsize=7, color=FAIL_COLOUR)


def _trial_axes(ax, trials: Sequence[TrialRow], log: bool, unit: str) -> None:
    numbers = [t.number for t in trials]
    if len(trials) <= _MAX_TICK_LABELS:
        ax.set_xticks(numbers, [f"#{t.number} {trial_label(t)}" for t in trials], rotation=35, ha="right", fontsize=7)
    ax.set_xlim(min(numbers, default=0) - 0.6, max(numbers, default=0) + 0.6)
    if not any(not is_failed(t) for t in trials):
        ax.set_yticks([])  # nothing measured: a scale would only suggest figures
        ax.set_ylabel(f"{unit} (no trial measured)")
    elif log:
        ax.set_yscale("log")
        ax.set_ylabel(f"{unit} (log scale; bars: 95% CI)")
    else:
        ax.set_ylim(bottom=0)
        ax.set_ylabel(f"{unit} (bars: 95% CI)")
    ax.set_xlabel("trial, in the order run")
    ax.grid(axis="x", visible=False)


def render_losses_svg(baseline: Sequence[float], tuned: Sequence[float] | None,
                      rejected: Sequence[tuple[str, Sequence[float]]] = ()) -> str:
    """The convergence guard's loss curves: baseline vs tuned, and any the guard rejected (dotted)."""

    def draw(fig) -> None:
        ax = fig.add_subplot()
        for label, losses in rejected:
            ax.plot(range(1, len(losses) + 1), _finite(losses), color=FAIL_COLOUR, linestyle=":", linewidth=1.2,
                    label=f"guard failed: {label}")
        ax.plot(range(1, len(baseline) + 1), baseline, color=STAGE_COLOURS["baseline"], marker="o", markersize=3,
                linewidth=2.2, label="baseline")
        if tuned is not None:
            ax.plot(range(1, len(tuned) + 1), _finite(tuned), color=TUNED_COLOUR, marker="s", markersize=3,
                    linewidth=1.4, label="tuned")
        ax.set_xlabel("optimizer step (same seed, same data order)")
        ax.set_ylabel("training loss")
        ax.legend(fontsize=8)

    return render_figure_svg("losses", "Loss curves of the baseline and the tuned config over the guard steps", 3.0, draw)


def _finite(values: Sequence[float]) -> list[float]:
    """NaN/Inf as gaps (matplotlib leaves NaN out of a line)."""
    return [v if isinstance(v, (int, float)) and math.isfinite(v) else math.nan for v in values]


# ---- bench and profile ------------------------------------------------------------------------------


def render_windows_svg(bench: BenchResult) -> str:
    """A bench's per-window figure (samples/s, or steps/s when the samples per step are unknown), its
    median and the median's 95% CI."""
    # lazy: matplotlib loads only when a chart is drawn
    from matplotlib.ticker import MaxNLocator

    rate, windows = bench.objective, list(bench.throughput.window_rates)

    def draw(fig) -> None:
        ax = fig.add_subplot()
        ax.axhspan(rate.ci_low, rate.ci_high, color=TUNED_COLOUR, alpha=0.15, label="95% CI of the median")
        ax.axhline(rate.value, color=TUNED_COLOUR, linewidth=1.5, label=f"median {rate.value:,.{_digits(rate.value)}f}")
        ax.plot(range(1, len(windows) + 1), windows, "o", color="#333333", markersize=4, label="one timing window")
        ax.set_xlabel("measurement window")
        ax.set_ylabel(rate.unit)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, max([*windows, rate.ci_high]) * 1.15)
        ax.legend(fontsize=8, loc="lower right")

    title = f"{rate.unit.capitalize()} of each timing window with the median and its 95% CI"
    return render_figure_svg("windows", title, 3.0, draw)


def _digits(value: float) -> int:
    """Decimals worth showing: none from 100 up (samples/s), two below (a few steps/s)."""
    return 0 if abs(value) >= 100 else 2


def render_split_svg(split: Mapping[str, Any]) -> str:
    """A profile's step time as one stacked bar: input wait, copy, forward, backward, optimizer, other.

    Args:
        split: the `profile.step_split` finding's data (`<phase>_us` and `<phase>_frac` per phase).
    """
    phases = [p for p in PHASE_COLOURS if split.get(f"{p}_us")]

    def draw(fig) -> None:
        ax = fig.add_subplot()
        left = 0.0
        for phase in phases:
            ms = split[f"{phase}_us"] / 1000
            frac = split.get(f"{phase}_frac") or 0.0
            ax.barh(0, ms, left=left, color=PHASE_COLOURS[phase], height=0.5,
                    label=f"{PHASE_TITLES[phase]}: {ms:.2f} ms ({frac:.0%})")
            if frac >= _SEGMENT_LABEL_FRAC:
                ax.text(left + ms / 2, 0, f"{frac:.0%}", ha="center", va="center", fontsize=9,
                        color="white" if phase not in ("other", "h2d", "backward") else "#222222")
            left += ms
        ax.set_yticks([])
        ax.set_xlabel("milliseconds per step (mean over the profiled steps)")
        ax.set_xlim(0, left * 1.02 or 1)
        ax.grid(axis="y", visible=False)
        fig.legend(loc="outside lower center", ncols=3, fontsize=8)

    return render_figure_svg("split", "Step time split by phase", 2.2, draw)
