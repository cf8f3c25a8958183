"""Rich rendering of a tune outcome: the waterfall of accepted changes and the rejected/failed trials.

Every figure is printed in its own unit (`Objective.unit`): a study measured in steps/s says steps/s.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from torchpace.measure.render import config_label, format_bytes, format_latency
from torchpace.measure.result import AccuracyReport, LatencyFigures, Objective
from torchpace.measure.stats import figure_text as stats_figure_text
from torchpace.measure.stats import ratio_text
from torchpace.tune.figures import SPEEDUP_FROM_FINAL, ReportedDecision, range_name
from torchpace.tune.outcome import ExportOutcome, TrialRow, TuneOutcome


def figure_text(figure: Objective | None) -> str:
    """`1,234 [1,200, 1,260]`: a figure with its 95% CI and the digits that CI supports
    (`measure.stats.figure_text`); `-` without one."""
    if figure is None or figure.value is None:
        return "-"
    return stats_figure_text(figure.value, figure.ci_low, figure.ci_high)


def ranged_text(row) -> str:
    """A row's figure (`figure_text`), naming its interval when that is the range of the measurements of its
    config (a paired study's baseline and tuned rows: `torchpace.tune.figures.config_range`)."""
    text = figure_text(row.throughput)
    return f"{text} ({range_name(row.measurements)})" if row.measurements and text != "-" else text


def render_outcome(console, o: TuneOutcome) -> None:
    if o.failed_baseline:
        console.print(f"[red]tune stopped:[/] {o.failed_baseline}")
    base = o.baseline
    if base and base.latency is not None:
        _render_inference_waterfall(console, o)
    elif base and o.paired:
        _render_paired_waterfall(console, o)
    elif base:
        table = Table(title=f"torchpace tune: {escape(o.workload)} ({o.strategy}, {len(o.trials)} trials, stopped: {o.stopped})")
        for column in ("change", f"{o.unit} [95% CI]", "step gain", "speedup vs baseline", "peak memory"):
            table.add_column(column)
        table.add_row(f"baseline ({o.baseline_label})", figure_text(base.throughput), "", "1.00x", format_bytes(base.peak_memory_bytes))
        for a in o.accepted:
            table.add_row(f"+ {a.knob} = {a.value}", figure_text(a.throughput), f"{a.step_gain:.2f}x",
                          f"{a.speedup:.2f}x", format_bytes(a.peak_memory_bytes))
        console.print(table)
    _render_not_kept(console, o.decisions)
    _render_rejected(console, o.trials, bool(o.command))
    if o.speedup is not None:
        console.print(f"[bold]best:[/] {best_line(o)}")
    if o.speedup_figure and o.speedup_figure.load_note:
        console.print(f"[yellow]note:[/] the final comparison was {o.speedup_figure.load_note}.")
    if o.noise:
        n = o.noise
        console.print(f"[dim]noise: the defaults compared with themselves gave "
                      f"{ratio_text(n.ratio, n.ratio_ci_low, n.ratio_ci_high, n.rounds)}[/]")
    if o.other_load and o.other_load.note:
        console.print(f"[yellow]warning:[/] {o.other_load.note}.")
    if o.figures_note:
        console.print(f"[dim]{o.figures_note}[/]")
    _render_run_on(console, o.run_on)
    if o.out_path:
        console.print(launch_hint(o.out_path, o.command), markup=False, highlight=False, soft_wrap=True)
    _render_export(console, o.export)
    console.print(f"[dim]{o.guard_note}[/]")


def launch_hint(out_path, command: Sequence[str] | None) -> str:
    """`wrote PATH (apply it: ... or torchpace launch --config PATH -- COMMAND)`, the command quoted for the
    shell (a Workload's hint names `train.py`, a script's its own command)."""
    launch = shlex.join(["torchpace", "launch", "--config", str(out_path), "--", *(command or ("train.py",))])
    return f"wrote {out_path}  (apply it: torchpace.prepare(workload, {str(out_path)!r}) or {launch})"


def best_line(o: TuneOutcome) -> str:
    """The summary line: the tuned config, its speedup over the defaults and where that figure comes from."""
    config = config_label(o.best_config, bool(o.command)) + ("" if o.best_config else " (nothing beat the noise)")
    figures = ""
    best, base = (o.best.throughput if o.best else None), (o.baseline.throughput if o.baseline else None)
    if best and base and o.objective == "throughput" and best.value:
        figures = f"  ({figure_text(best).partition(' ')[0]} / {figure_text(base).partition(' ')[0]} {best.unit})"
    speedup = o.speedup_figure
    if speedup is None:
        return f"{config}  ->  {o.speedup:.2f}x the baseline{figures}"
    if not o.best_config:
        return config
    ratio = ratio_text(o.speedup, speedup.ci_low, speedup.ci_high, speedup.rounds)
    how = " (in separate runs A B A B A B: the two configs could not be held at once)" if speedup.mode == "sequential" else ""
    return f"{config}  ->  {ratio} the defaults{figures}; {speedup.source}{how}"


def _render_paired_waterfall(console, o: TuneOutcome) -> None:
    """Greedy by paired comparisons: each accepted change with its comparison's ratio and CI."""
    base = o.baseline
    table = Table(title=f"torchpace tune: {escape(o.workload)} ({o.strategy}, each change compared in alternation with "
                        f"the config before it; {len(o.trials)} comparisons, stopped: {o.stopped})")
    for column in ("change", f"{o.unit} [95% CI]", "gain [95% CI]", "cumulative", "peak memory"):
        table.add_column(column, overflow="fold")
    table.add_row(f"baseline ({o.baseline_label})", ranged_text(base), "", "1.00x", format_bytes(base.peak_memory_bytes))
    for a in o.accepted:
        gain = ratio_text(a.step_gain, a.step_gain_ci_low, a.step_gain_ci_high, a.rounds) \
            + (" (separate runs)" if a.mode == "sequential" else "")
        table.add_row(f"+ {a.knob} = {a.value}", figure_text(a.throughput), gain, f"{a.speedup:.2f}x",
                      format_bytes(a.peak_memory_bytes))
    speedup = o.speedup_figure
    if o.best is not None and o.best_config and speedup is not None and speedup.source == SPEEDUP_FROM_FINAL:
        table.add_row("tuned, compared with the defaults", ranged_text(o.best),
                      ratio_text(o.speedup, speedup.ci_low, speedup.ci_high, speedup.rounds), f"{o.speedup:.2f}x",
                      format_bytes(o.best.peak_memory_bytes))
    console.print(table)
    for a in o.accepted:
        if a.load_note:
            console.print(f"[yellow]note:[/] {a.knob} = {a.value} was {a.load_note}.")


def _rate(figure: Objective | None) -> str:
    return figure_text(figure) if figure and figure.value else "-"


def _p50(latency: LatencyFigures | None) -> str:
    if latency is None:
        return "-"
    return f"{format_latency(latency.p50_s)} ±{latency.ci_rel_halfwidth:.1%}"


def _accuracy_cell(accuracy: AccuracyReport | None) -> str:
    if not accuracy:
        return ""
    top1 = f" / {accuracy.top1_agreement:.1%}" if accuracy.top1_agreement is not None else ""
    return f"{accuracy.max_rel_err:.2%}{top1}"


def _render_inference_waterfall(console, o: TuneOutcome) -> None:
    """Inference: batch-1 latency and throughput of the baseline and each accepted change."""
    base = o.baseline
    table = Table(title=f"torchpace tune: {escape(o.workload)} (objective {o.objective}, {o.strategy}, "
                        f"{len(o.trials)} trials, stopped: {o.stopped})")
    for column in ("change", "p50 batch 1", "p99", o.unit, "speedup", "size", "rel err / top-1"):
        table.add_column(column)
    table.add_row("baseline (defaults)", _p50(base.latency), format_latency(base.latency.p99_s), _rate(base.throughput),
                  "1.00x", format_bytes(base.model_size_bytes), _accuracy_cell(base.accuracy))
    for a in o.accepted:
        table.add_row(f"+ {a.knob}={a.value}", _p50(a.latency), format_latency(a.latency.p99_s if a.latency else None),
                      _rate(a.throughput), f"{a.speedup:.2f}x", format_bytes(a.model_size_bytes), _accuracy_cell(a.accuracy))
    console.print(table)


def _render_run_on(console, check) -> None:
    """The kept config's run past the measured steps: what it got through, or what failed and what was taken back."""
    if check is None:
        return
    colour = "green" if check.run.ok else "dim" if check.run.status == "unreached" else "red"
    from rich.markup import escape  # lazy: as the console itself, rich loads only where a table is shown

    console.print(f"[{colour}]run past the measured steps:[/] {escape(check.describe())}", highlight=False)
    if check.culprit is not None or (check.run.status == "failed" and not check.own_failure):
        console.print(f"written config: {dict(check.kept) or 'the defaults'}", markup=False, highlight=False)


def _render_export(console, export: ExportOutcome | None) -> None:
    if not export:
        return
    if export.error:
        console.print(f"[red]--export {export.path} failed:[/] {export.error}")
        return
    loader = "torch.export.load(PATH).module()" if export.format == "torch_export" else "torch.jit.load(PATH)"
    console.print(f"exported the tuned model to {export.path} ({export.format}, {format_bytes(export.size_bytes)}; "
                  f"reloaded, max abs diff {export.max_abs_diff:.2g}); load it with {loader}")
    if export.fallback_reason:
        console.print(f"[dim]torch.export did not work for this model, so TorchScript was used: {export.fallback_reason}[/]")
    if export.runtime:
        runtime = ", ".join(f"{k}={v}" for k, v in export.runtime.items())
        console.print(f"apply where you serve it (not part of the file): {runtime}")


def _render_not_kept(console, decisions: Sequence[ReportedDecision]) -> None:
    """Greedy: each knob tried and not kept, with the policy's one-line reason (no faster, within the
    noise, every value failed), so the summary accounts for every trial, not only the accepted ones."""
    rejected = [d for d in decisions if d.decision.accepted_value is None]
    if not rejected:
        return
    table = Table(title="knobs tried and not kept")
    for column in ("knob", "why"):
        table.add_column(column, overflow="fold")
    for reported in rejected:
        why = reported.decision.reason.removeprefix("rejected: ")
        if reported.decision.mode == "sequential":
            why += " (compared in separate runs)"
        if reported.load_note:
            why += f" ({reported.load_note})"
        table.add_row(reported.decision.knob, why)
    console.print(table)


def _render_rejected(console, trials: Sequence[TrialRow], script: bool = False) -> None:
    rows = [t for t in trials if t.status != "ok" or t.guard == "fail"]
    if not rows:
        return
    table = Table(title="failed, guard-rejected and unfinished trials")
    for column in ("#", "config", "status", "reason"):
        table.add_column(column)
    for t in rows:
        config = config_label(t.config, script)
        status = t.status if t.status != "ok" else "guard"
        reason = t.guard_reason if t.status == "ok" else (t.error or "")
        table.add_row(str(t.number), config, status, (reason or "")[:120])
    console.print(table)
