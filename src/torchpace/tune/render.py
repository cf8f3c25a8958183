"""Rich rendering of a tune outcome: the waterfall of accepted changes and the rejected/failed trials."""

from __future__ import annotations

from typing import Any

from torchpace.measure.render import format_bytes, format_latency


def _ci(row: dict) -> str:
    if row.get("samples_per_s_ci_low") is None:
        return ""
    return f" [{row['samples_per_s_ci_low']:,.0f}, {row['samples_per_s_ci_high']:,.0f}]"


def render_outcome(console, o: dict[str, Any]) -> None:
    from rich.table import Table

    if o["failed_baseline"]:
        console.print(f"[red]tune stopped:[/] {o['failed_baseline']}")
    base = o["baseline"]
    if base and base.get("latency_p50_s") is not None:
        _render_inference_waterfall(console, o)
    elif base and _paired(o):
        _render_paired_waterfall(console, o)
    elif base:
        table = Table(title=f"torchpace tune: {o['workload']} ({o['strategy']}, {len(o['trials'])} trials, stopped: {o['stopped']})")
        unit = base.get("throughput_unit", "samples")
        for column in ("change", f"{unit}/s [95% CI]", "step gain", "speedup vs baseline", "peak memory"):
            table.add_column(column)
        table.add_row("baseline (PyTorch defaults)", f"{base['samples_per_s']:,.1f}{_ci(base)}", "", "1.00x", format_bytes(base["peak_memory_bytes"]))
        for a in o["accepted"]:
            table.add_row(f"+ {a['knob']} = {a['value']}", f"{a['samples_per_s']:,.1f}{_ci(a)}", f"{a['step_gain']:.2f}x",
                          f"{a['speedup']:.2f}x", format_bytes(a["peak_memory_bytes"]))
        console.print(table)
    _render_not_kept(console, (o.get("extras") or {}).get("decisions") or [])
    _render_rejected(console, o["trials"])
    if o["speedup"] is not None:
        console.print(f"[bold]best:[/] {best_line(o)}")
    extras = o.get("extras") or {}
    if (extras.get("speedup") or {}).get("load_note"):
        console.print(f"[yellow]note:[/] the final comparison was {extras['speedup']['load_note']}.")
    if extras.get("noise"):
        noise = extras["noise"]
        console.print(f"[dim]noise: the defaults compared with themselves gave {noise['ratio']:.3f}x "
                      f"(95% CI {noise['ratio_ci_low']:.3f}-{noise['ratio_ci_high']:.3f}, {noise['rounds']} rounds)[/]")
    if (extras.get("other_load") or {}).get("note"):
        console.print(f"[yellow]warning:[/] {extras['other_load']['note']}.")
    if extras.get("figures"):
        console.print(f"[dim]{extras['figures']}[/]")
    if o["out_path"]:
        console.print(f"wrote {o['out_path']}  (apply it: torchpace.prepare(workload, '{o['out_path']}') or "
                      f"torchpace launch --config {o['out_path']} -- train.py)")
    _render_export(console, o.get("export"))
    console.print(f"[dim]{o['guard_note']}[/]")


def _paired(o: dict[str, Any]) -> bool:
    return bool((o.get("extras") or {}).get("speedup"))


def ratio_text(ratio: float | None, low: float | None, high: float | None, rounds: int | None = None) -> str:
    """`1.32x [1.25, 1.40]` (and the rounds), or `-` without a ratio."""
    if ratio is None:
        return "-"
    ci = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    return f"{ratio:.2f}x{ci}" + (f", {rounds} rounds" if rounds else "")


def best_line(o: dict[str, Any]) -> str:
    """The summary line: the tuned config, its speedup over the defaults and where that figure comes from."""
    config = ", ".join(f"{k}={v}" for k, v in o["best_config"].items()) or "PyTorch defaults (nothing beat the noise)"
    unit = (o.get("baseline") or {}).get("throughput_unit", "samples")
    figures = ""
    if o.get("best") and o.get("baseline") and o["objective"] == "throughput" and o["best"].get("samples_per_s"):
        figures = f"  ({o['best']['samples_per_s']:,.1f} / {o['baseline']['samples_per_s']:,.1f} {unit}/s)"
    speedup = (o.get("extras") or {}).get("speedup")
    if not speedup:
        return f"{config}  ->  {o['speedup']:.2f}x the baseline{figures}"
    if not o["best_config"]:
        return config
    ratio = ratio_text(o["speedup"], speedup.get("speedup_ci_low"), speedup.get("speedup_ci_high"), speedup.get("speedup_rounds"))
    how = " (in separate runs A B A B A: the two configs could not be held at once)" if speedup.get("speedup_mode") == "sequential" else ""
    return f"{config}  ->  {ratio} the defaults{figures}; {speedup['speedup_from']}{how}"


def _render_paired_waterfall(console, o: dict[str, Any]) -> None:
    """Greedy by paired comparisons: each accepted change with its comparison's ratio and CI."""
    from rich.table import Table

    base = o["baseline"]
    unit = base.get("throughput_unit", "samples")
    table = Table(title=f"torchpace tune: {o['workload']} ({o['strategy']}, each change compared in alternation with "
                        f"the config before it; {len(o['trials'])} comparisons, stopped: {o['stopped']})")
    for column in ("change", f"{unit}/s [95% CI]", "gain [95% CI]", "cumulative", "peak memory"):
        table.add_column(column, overflow="fold")
    table.add_row("baseline (PyTorch defaults)", f"{base['samples_per_s']:,.1f}{_ci(base)}", "", "1.00x",
                  format_bytes(base.get("peak_memory_bytes")))
    for a in o["accepted"]:
        gain = ratio_text(a["step_gain"], a.get("step_gain_ci_low"), a.get("step_gain_ci_high"), a.get("rounds")) \
            + (" (separate runs)" if a.get("mode") == "sequential" else "")
        table.add_row(f"+ {a['knob']} = {a['value']}", f"{a['samples_per_s']:,.1f}{_ci(a)}", gain, f"{a['speedup']:.2f}x",
                      format_bytes(a.get("peak_memory_bytes")))
    console.print(table)
    for a in o["accepted"]:
        if a.get("load_note"):
            console.print(f"[yellow]note:[/] {a['knob']} = {a['value']} was {a['load_note']}.")


def _p50(row: dict) -> str:
    if row.get("latency_ci_rel_halfwidth") is None:
        return format_latency(row.get("latency_p50_s"))
    return f"{format_latency(row['latency_p50_s'])} ±{row['latency_ci_rel_halfwidth']:.1%}"


def _accuracy_cell(row: dict) -> str:
    accuracy = row.get("accuracy")
    if not accuracy:
        return ""
    top1 = f" / {accuracy['top1_agreement']:.1%}" if accuracy.get("top1_agreement") is not None else ""
    return f"{accuracy['max_rel_err']:.2%}{top1}"


def _render_inference_waterfall(console, o: dict[str, Any]) -> None:
    """Inference: batch-1 latency and throughput of the baseline and each accepted change."""
    from rich.table import Table

    base = o["baseline"]
    table = Table(title=f"torchpace tune: {o['workload']} (objective {o['objective']}, {o['strategy']}, "
                        f"{len(o['trials'])} trials, stopped: {o['stopped']})")
    for column in ("change", "p50 batch 1", "p99", "samples/s", "speedup", "size", "rel err / top-1"):
        table.add_column(column)
    table.add_row("baseline (defaults)", _p50(base), format_latency(base.get("latency_p99_s")),
                  f"{base['samples_per_s']:,.0f}", "1.00x", format_bytes(base.get("model_size_bytes")), _accuracy_cell(base))
    for a in o["accepted"]:
        sps = f"{a['samples_per_s']:,.0f}" if a.get("samples_per_s") else "-"
        table.add_row(f"+ {a['knob']}={a['value']}", _p50(a), format_latency(a.get("latency_p99_s")), sps, f"{a['speedup']:.2f}x",
                      format_bytes(a.get("model_size_bytes")), _accuracy_cell(a))
    console.print(table)


def _render_export(console, export: dict[str, Any] | None) -> None:
    if not export:
        return
    if export.get("error"):
        console.print(f"[red]--export {export['path']} failed:[/] {export['error']}")
        return
    loader = "torch.export.load(PATH).module()" if export["format"] == "torch_export" else "torch.jit.load(PATH)"
    console.print(f"exported the tuned model to {export['path']} ({export['format']}, {format_bytes(export['size_bytes'])}; "
                  f"reloaded, max abs diff {export['max_abs_diff']:.2g}); load it with {loader}")
    if export.get("fallback_reason"):
        console.print(f"[dim]torch.export did not work for this model, so TorchScript was used: {export['fallback_reason']}[/]")
    if export.get("runtime"):
        runtime = ", ".join(f"{k}={v}" for k, v in export["runtime"].items())
        console.print(f"apply where you serve it (not part of the file): {runtime}")


def _render_not_kept(console, decisions: list[dict]) -> None:
    """Greedy: each knob tried and not kept, with the policy's one-line reason (no faster, within the
    noise, every value failed), so the summary accounts for every trial, not only the accepted ones."""
    from rich.table import Table

    rejected = [d for d in decisions if d.get("accepted_value") is None]
    if not rejected:
        return
    table = Table(title="knobs tried and not kept")
    for column in ("knob", "why"):
        table.add_column(column, overflow="fold")
    for decision in rejected:
        why = decision["reason"].removeprefix("rejected: ")
        if decision.get("mode") == "sequential":
            why += " (compared in separate runs)"
        if decision.get("load_note"):
            why += f" ({decision['load_note']})"
        table.add_row(decision["knob"], why)
    console.print(table)


def _render_rejected(console, trials: list[dict]) -> None:
    from rich.table import Table

    rows = [t for t in trials if t["status"] != "ok" or t["guard"] == "fail"]
    if not rows:
        return
    table = Table(title="failed, guard-rejected and unfinished trials")
    for column in ("#", "config", "status", "reason"):
        table.add_column(column)
    for t in rows:
        config = ", ".join(f"{k}={v}" for k, v in t["config"].items()) or "defaults"
        status = t["status"] if t["status"] != "ok" else "guard"
        reason = t["guard_reason"] if t["status"] == "ok" else (t["error"] or "")
        table.add_row(str(t["number"]), config, status, reason[:120])
    console.print(table)
