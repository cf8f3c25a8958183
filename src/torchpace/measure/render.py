"""Rich rendering of a bench result (a dict as in `BenchResult.to_dict`)."""

from __future__ import annotations

from typing import Any


def format_bytes(n: float | None, missing: str = "-") -> str:
    """``1536`` -> ``1.5 KiB``; None -> `missing` (shared by every renderer)."""
    if n is None:
        return missing
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def bench_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the bench table."""
    ci = f"[{r['samples_per_s_ci_low']:,.1f}, {r['samples_per_s_ci_high']:,.1f}] (±{r['ci_rel_halfwidth']:.1%})"
    rows = [
        ("samples/s (median)", f"{r['samples_per_s']:,.1f}"),
        ("95% CI of median", ci),
        ("IQR", f"{r['samples_per_s_iqr']:,.1f} ({r['samples_per_s_iqr'] / r['samples_per_s']:.1%} of median)"),
        ("step time", f"{r['step_time_s'] * 1000:.2f} ms  (batch {r['batch_size']}"
                      + (f", {r['grad_accumulation']} micro-batches" if r["grad_accumulation"] > 1 else "") + ")"),
    ]
    if r.get("world_size", 1) > 1:
        rows.append(("processes", f"{r['world_size']} ranks x batch {r['batch_size']} = global batch {r['global_batch_size']}  "
                                  "(samples/s summed over ranks; step time and peak memory of the slowest / largest rank)"))
    if r.get("compute_only_samples_per_s"):
        rows += [("compute-only samples/s", f"{r['compute_only_samples_per_s']:,.1f}  (one batch pre-staged on {r['device']})"),
                 ("input-bound", f"{r['input_bound_frac']:.1%} of the step waits for data")]
    rows += [
        ("peak memory", f"{format_bytes(r['peak_memory_bytes'])}  ({r['peak_memory_kind']})"),
        ("windows / steps", f"{r['windows']} / {r['measured_steps']}  (stopped by {r['stopped_by']})"),
        ("warm-up", f"{r['warmup_s']:.1f} s, {r['warmup_steps']} steps" + ("" if r["warmup_converged"] else "  (did not settle)")),
    ]
    if r.get("loss_values"):
        rows.append(("loss", f"{r['loss_values'][0]:.4g} -> {r['loss_values'][-1]:.4g} over {len(r['loss_values'])} steps"))
    return rows + inference_rows(r)


def format_latency(seconds: float | None) -> str:
    """`31.2 µs` below a millisecond, `2.12 ms` above; `-` when not measured."""
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def inference_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """Rows for inference benches: batch-1 latency percentiles, model size, accuracy vs fp32."""
    rows = []
    if r.get("latency_p50_s") is not None:
        ci = f"[{format_latency(r['latency_p50_ci_low_s'])}, {format_latency(r['latency_p50_ci_high_s'])}] (±{r['latency_ci_rel_halfwidth']:.1%})"
        rows += [("latency p50 (batch 1)", f"{format_latency(r['latency_p50_s'])}  95% CI {ci}"),
                 ("latency p90 / p99", f"{format_latency(r['latency_p90_s'])} / {format_latency(r['latency_p99_s'])}  "
                                       f"({r['latency_calls']} calls, stopped by {r['latency_stopped_by']})")]
    if r.get("model_size_bytes") is not None:
        rows.append(("model size", format_bytes(r["model_size_bytes"])))
    if r.get("accuracy"):
        rows.append(("accuracy vs fp32", r["accuracy"]["reason"]))
    return rows


def render_bench(console, r: dict[str, Any]) -> None:
    from rich.table import Table

    config = ", ".join(f"{k}={v}" for k, v in r["config"].items()) or "defaults"
    table = Table(title=f"torchpace bench: {r['workload']} on {r['device']} ({config})", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in bench_rows(r):
        table.add_row(label, value)
    console.print(table)
    if r["noise_warning"]:
        console.print(f"[yellow]warning:[/] noisy measurement: IQR is {r['samples_per_s_iqr'] / r['samples_per_s']:.0%} "
                      "of the median (>10%). Other load on this host? Re-run, or raise --max-time.")
