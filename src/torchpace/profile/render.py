"""Rich rendering of a profile result (`ProfileResult`, as measured or read back from its JSON)."""

from __future__ import annotations

from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from torchpace.measure.render import noise_warnings
from torchpace.profile.analyzers import PHASE_TITLES
from torchpace.profile.figures import StepSplit, TopOps, figures_of
from torchpace.profile.result import ProfileResult
from torchpace.profile.verdict import Verdict

_SEVERITY_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "fail": "red"}
_BAR_WIDTH = 30
SHOWN_AS_TABLES = (StepSplit.FINDING_ID, TopOps.FINDING_ID)  # findings shown as their own tables, not in the list


def split_rows(result: ProfileResult) -> list[tuple[str, str, str, str]]:
    """(phase, ms per step, share, bar) rows of the step-split table; empty without a split."""
    split = result.step_split
    if split is None:
        return []
    return [(PHASE_TITLES[name], f"{phase.us / 1000:.2f}", f"{phase.frac:.1%}", "█" * round(phase.frac * _BAR_WIDTH))
            for name, phase in split.phases.items()]


def top_op_rows(result: ProfileResult, limit: int = 8) -> list[tuple[str, str, str, str]]:
    """(operator, calls, self ms per step, share) rows."""
    top, split = figures_of(result.findings, TopOps), figures_of(result.findings, StepSplit)
    if top is None or split is None:
        return []
    steps = max(1, split.steps)
    return [(row.name, str(row.calls), f"{row.self_us / steps / 1000:.2f}", f"{row.self_frac:.1%}") for row in top.ops[:limit]]


def profile_warnings(result: ProfileResult) -> list[str]:
    """The noise warnings of a profile (bench's, over the profiled steps' times)."""
    return noise_warnings(result.noise_warning, result.step_time_iqr_frac, "profiled steps' times", "raise --steps",
                          result.other_load_cores, result.usable_cores)


def render_profile(console, result: ProfileResult) -> None:
    """Print the verdict, the step split, findings, top operators, remedies and the trace path."""
    config = ", ".join(f"{k}={v}" for k, v in result.config.items()) or "defaults"
    console.print(f"[bold]torchpace profile[/]: {escape(result.workload)} on {result.device} ({escape(config)}), "
                  f"{result.steps} profiled steps")
    verdict = result.verdict
    body = "\n".join(f"• {line}" for line in verdict.evidence)
    if verdict.also:
        body += "\nalso: " + ", ".join(kind.value for kind in verdict.also)
    console.print(Panel(body, title=f"[bold]verdict: {verdict.kind.value}[/]", expand=False))
    _render_split(console, result)
    _render_findings(console, result)
    _render_top_ops(console, result)
    _render_remedies(console, verdict)
    if result.trace_path:
        console.print(f"trace: {result.trace_path}  (open in https://ui.perfetto.dev or chrome://tracing)")
    for warning in profile_warnings(result):
        console.print(f"[yellow]warning:[/] {warning}")


def _table(title: str, *columns: str):
    table = Table(title=title, title_justify="left", show_edge=False)
    for column in columns:
        table.add_column(column, justify="right" if column in ("ms/step", "share", "calls", "self ms/step") else "left")
    return table


def _render_split(console, result: ProfileResult) -> None:
    rows = split_rows(result)
    if not rows:
        return
    table = _table("step time split", "phase", "ms/step", "share", "")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _render_findings(console, result: ProfileResult) -> None:
    table = _table("findings", "", "finding", "evidence")
    for f in result.findings:
        if f.id in SHOWN_AS_TABLES:
            continue
        severity = f.severity.value
        evidence = f.evidence
        if severity == "warn" and f.remedy:
            evidence += f"\n[dim]→ {f.remedy.text}[/]"
        table.add_row(f"[{_SEVERITY_STYLE.get(severity, '')}]{severity}[/]", f.title, evidence)
    console.print(table)


def _render_top_ops(console, result: ProfileResult) -> None:
    rows = top_op_rows(result)
    if not rows:
        return
    table = _table("top operators by self CPU time", "operator", "calls", "self ms/step", "share")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _render_remedies(console, verdict: Verdict) -> None:
    console.print("[bold]what to do[/]")
    for remedy in verdict.remedies:
        text = remedy.remedy.text if remedy.remedy else ""
        console.print(f"• {remedy.title}: {text}")
        if remedy.remedy and remedy.remedy.command:
            # as it is, on one line (a terminal folds it without a line break): copied, it pastes whole
            console.print(f"    $ {remedy.remedy.command}", markup=False, highlight=False, soft_wrap=True)
    for _, reason in verdict.not_offered:
        console.print(f"[dim]• not offered: {escape(reason)}[/]", highlight=False)
    knobs = ", ".join(verdict.knobs_to_try) or "none registered yet"
    console.print(f"[bold]tune tries first[/] (stage {', '.join(verdict.stages_to_try)}): {knobs}")
