"""Rich rendering of a bench result (`torchpace.measure.result.BenchResult`), and the cells of a comparison
(`torchpace.measure.comparison.Comparison`) that its terminal table and the report show alike."""

from __future__ import annotations

from typing import Any, Mapping

from rich.markup import escape
from rich.table import Table

from torchpace.measure.comparison import Comparison
from torchpace.measure.contention import contention_note
from torchpace.measure.result import SECONDS, BenchResult, ScriptInfo
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI, figure_decimals, figure_text


SCRIPT_OWN = "the script's own settings"  # what a script runs with where the config sets nothing
DEFAULTS = "PyTorch defaults"  # what a Workload runs with where the config sets nothing (prepare() builds it)


def config_label(config: Mapping[str, Any], script: bool = False) -> str:
    """What ran, in words (every output's one label for a config): the knobs set, `k=v` (a value equal to a
    knob's default too: over a script's own argument it changes what runs), else the script's own settings (an
    unmodified script: its DataLoader and optimizer as it built them) or, for a Workload, PyTorch's defaults."""
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items())) or (SCRIPT_OWN if script else DEFAULTS)


def settings_text(settings: Mapping[str, Any] | None) -> str:
    """`num_workers=2, pin_memory=True, optimizer.impl=default`: a script's own settings (empty when unknown)."""
    return ", ".join(f"{k.removeprefix('data.')}={v}" for k, v in sorted((settings or {}).items()))


def format_bytes(n: float | None, missing: str = "-") -> str:
    """``1536`` -> ``1.5 KiB``; None -> `missing` (shared by every renderer)."""
    if n is None:
        return missing
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _ci_text(low: float, high: float, decimals: int, t) -> str:
    """A CI cell: `[low, high] (±x%)`, or with fewer windows than a 95% CI needs, what the range is."""
    bounds = f"[{low:,.{decimals}f}, {high:,.{decimals}f}]"
    if t.windows < MIN_WINDOWS_FOR_CI:
        return f"{bounds} (the range of {t.windows} window(s): a 95% CI needs {MIN_WINDOWS_FOR_CI})"
    return f"{bounds} (±{t.ci_rel_halfwidth:.1%})"


def throughput_rows(r: BenchResult) -> list[tuple[str, str]]:
    """The measured figure's rows: samples/s, or steps/s when the samples per step are unknown (script mode),
    each with the digits its CI supports (`measure.stats.figure_decimals`)."""
    t = r.throughput
    if not t.samples_known:
        digits = figure_decimals(t.steps_per_s, t.steps_per_s_ci_low, t.steps_per_s_ci_high)
        ci = _ci_text(t.steps_per_s_ci_low, t.steps_per_s_ci_high, digits, t)
        return [("steps/s (median)", f"{t.steps_per_s:,.{digits}f}  (samples per step unknown: no DataLoader batch seen; "
                                     "--samples-per-step N gives samples/s)"),
                ("95% CI of median", ci)]
    digits = figure_decimals(t.samples_per_s, t.samples_per_s_ci_low, t.samples_per_s_ci_high)
    ci = _ci_text(t.samples_per_s_ci_low, t.samples_per_s_ci_high, digits, t)
    rows = [("samples/s (median)", f"{t.samples_per_s:,.{digits}f}"), ("95% CI of median", ci),
            ("IQR", f"{t.samples_per_s_iqr:,.{digits}f} ({t.iqr_frac:.1%} of median)")]
    if t.steps_per_s is not None:
        rows.append(("steps/s", figure_text(t.steps_per_s, t.steps_per_s_ci_low, t.steps_per_s_ci_high)))
    return rows


def step_time_text(t) -> str:
    """`412 ms`: the step time (1 / the windows' median steps/s) with the digits its CI supports (the steps/s
    CI's bounds, inverted)."""
    low = 1000 / t.steps_per_s_ci_high if t.steps_per_s_ci_high else None
    high = 1000 / t.steps_per_s_ci_low if t.steps_per_s_ci_low else None
    ms = t.step_time_s * 1000
    return f"{ms:,.{figure_decimals(ms, low, high)}f} ms"


def bench_rows(r: BenchResult) -> list[tuple[str, str]]:
    """(label, value) rows of the bench table."""
    step, t = r.step, r.throughput
    batch = "batch unknown" if step.batch_size is None else f"batch {step.batch_size}"
    micro = f", {step.grad_accumulation} {'backward() calls' if r.script else 'micro-batches'}"
    rows = throughput_rows(r) + [
        ("step time", f"{step_time_text(t)}  ({batch}" + (micro if step.grad_accumulation > 1 else "") + ")"),
    ]
    if step.world_size > 1:
        rows.append(("processes", f"{step.world_size} ranks x batch {step.batch_size} = global batch {step.global_batch_size}  "
                                  f"({t.unit} summed over ranks; step time and peak memory of the slowest / largest rank)"))
    rows += rank_rows(r)
    if r.compute_only_samples_per_s:
        rows += [("compute-only samples/s", f"{r.compute_only_samples_per_s:,.1f}  (one batch pre-staged on {r.device})"),
                 ("input-bound", f"{r.input_bound_frac:.1%} of the step waits for data")]
    elif r.script and r.input_bound_frac is not None:
        rows.append(("input-bound", f"{r.input_bound_frac:.1%} of the step is spent in the DataLoader's __next__"))
    rows += [
        ("peak memory", f"{format_bytes(r.peak_memory_bytes)}  ({r.peak_memory_kind})"),
        ("windows / steps", f"{t.windows} / {t.measured_steps}  (stopped by {t.stopped_by})"),
        ("warm-up", f"{t.warmup_s:.1f} s, {t.warmup_steps} steps" + ("" if t.warmup_converged else "  (did not settle)")),
    ]
    if r.other_load_cores is not None:
        rows.append(("other load", f"{r.other_load_cores:.1f} cores used by processes outside torchpace meanwhile"))
    if r.loss_values:
        rows.append(("loss", f"{r.loss_values[0]:.4g} -> {r.loss_values[-1]:.4g} over {len(r.loss_values)} steps"))
    return rows + script_rows(r.script) + inference_rows(r)


_RANKS_LISTED = 8  # ranks named one by one in a row; a larger job shows the spread (fewest, median, most)


def rank_rows(r: BenchResult) -> list[tuple[str, str]]:
    """A job of several processes measured from inside its script: each figure by rank (its own clock), the
    spread, and the straggler when one held the others back."""
    if len(r.ranks) < 2:
        return []
    rows = [("by rank: steps/s", _by_rank([f.steps_per_s for f in r.ranks], "{:.3g}") + "  (each rank's own clock)")]
    if any(f.input_wait_frac is not None for f in r.ranks):
        rows.append(("by rank: input wait", _by_rank([f.input_wait_frac for f in r.ranks], "{:.1%}")))
    if any(f.backward_frac is not None for f in r.ranks):
        rows.append(("by rank: in backward()", _by_rank([f.backward_frac for f in r.ranks], "{:.1%}")
                     + "  (where DDP's all-reduce waits for the slowest rank)"))
    rows.append(("by rank: peak memory", _by_rank([f.peak_memory_bytes for f in r.ranks], None)))
    if any(f.mean_loss is not None for f in r.ranks):
        rows.append(("by rank: mean loss", _by_rank([f.mean_loss for f in r.ranks], "{:.4g}")))
    rows.append(("straggler", r.straggler.why if r.straggler is not None else
                 "none: no rank's steps or input wait stand out from the others'"))
    return rows


def _by_rank(values: list, form: str | None) -> str:
    def shown(value) -> str:
        if value is None:
            return "-"
        return format_bytes(value) if form is None else form.format(value)

    if len(values) <= _RANKS_LISTED:
        return " · ".join(f"{rank}: {shown(v)}" for rank, v in enumerate(values))
    known = sorted(v for v in values if v is not None)
    if not known:
        return "-"
    return f"fewest {shown(known[0])}, median {shown(known[len(known) // 2])}, most {shown(known[-1])} over {len(values)} ranks"


def script_rows(script: ScriptInfo | None) -> list[tuple[str, str]]:
    """Script mode: how steps were counted, and every argument the config changed in the script."""
    if not script:
        return []
    step = ("one optimizer step()" if script.step_source == "optimizer"
            else "one backward() (no torch.optim optimizer was built)")
    rows = [("a step is", step)]
    if script.script_settings:
        rows.append((SCRIPT_OWN, f"{settings_text(script.script_settings)}  (its DataLoader and optimizer as it built them; "
                                 "what the knobs set replaced these)"))
    if script.ended_early:
        rows.append(("note", "the script ended before the measurement did: these are the windows it gave"))
    for change in script.overrides:
        rows.append(("changed", f"{change.object} at {change.where}: {change.argument} "
                                f"{change.old!r} -> {change.new!r} ({change.knob})"))
    compiled = script.compile
    if compiled is not None and compiled.modules:
        breaks = compiled.break_reasons
        why = f" ({'; '.join(f'{reason} x{n}' for reason, n in breaks.items())})" if breaks else ""
        rows.append(("compiled", f"{', '.join(compiled.modules)} after the first step ({compiled.mode}): "
                                 f"{compiled.graphs} graph(s), {compiled.graph_breaks} graph break(s){why}"))
        if compiled.compile_s is not None:
            cached = compiled.cache_hits + compiled.cache_misses
            reuse = f", {compiled.cache_hits} of {cached} graphs from the compiler's cache" if cached else ""
            rows.append(("compile time", f"{compiled.compile_s:.1f} s{reuse}"))
    if script.output_log:
        rows.append(("script output", script.output_log))
    return rows


def format_latency(seconds: float | None) -> str:
    """`31.2 µs` below a millisecond, `2.12 ms` above; `-` when not measured."""
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def inference_rows(r: BenchResult) -> list[tuple[str, str]]:
    """Rows for inference benches: batch-1 latency percentiles, model size, accuracy vs fp32."""
    rows = []
    lat = r.latency
    if lat is not None:
        ci = f"[{format_latency(lat.p50_ci_low_s)}, {format_latency(lat.p50_ci_high_s)}] (±{lat.ci_rel_halfwidth:.1%})"
        rows += [("latency p50 (batch 1)", f"{format_latency(lat.p50_s)}  95% CI {ci}"),
                 ("latency p90 / p99", f"{format_latency(lat.p90_s)} / {format_latency(lat.p99_s)}  "
                                       f"({lat.calls} calls, stopped by {lat.stopped_by})")]
    if r.model_size_bytes is not None:
        rows.append(("model size", format_bytes(r.model_size_bytes)))
    if r.accuracy:
        rows.append(("accuracy vs fp32", r.accuracy.reason))
    return rows


def render_bench(console, r: BenchResult) -> None:
    config = config_label(r.config, r.script is not None)
    table = Table(title=f"torchpace bench: {escape(r.workload)} on {r.device} ({escape(config)})", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in bench_rows(r):
        table.add_row(label, value)
    console.print(table)
    for warning in bench_warnings(r):
        console.print(f"[yellow]warning:[/] {warning}")


def bench_warnings(r: BenchResult) -> list[str]:
    """The warnings beside a bench's figure (the terminal's and the report's)."""
    return noise_warnings(r.throughput.noise_warning, r.throughput.iqr_frac, "windows", "raise --max-time",
                          r.other_load_cores, r.host.get("usable_cores"))


def noise_warnings(noisy: bool, iqr_frac: float | None, what: str, remedy: str, other_load_cores: float | None,
                   usable_cores: int | None) -> list[str]:
    """The warnings beside a measured figure, for bench, profile and the report alike: a spread over 10%
    of the median (`measure.stats`), and other processes' CPU use when material (`measure.contention`)."""
    warnings = []
    if noisy:
        spread = f"{iqr_frac:.0%} of the median (over 10%)" if iqr_frac is not None else "over 10% of the median"
        warnings.append(f"noisy measurement: the IQR of the {what} is {spread}. Other load on this host? Re-run, or {remedy}.")
    note = contention_note(other_load_cores, usable_cores or 1)
    if note:
        warnings.append(note + ".")
    return warnings


# ---- a comparison's cells ---------------------------------------------------------------------------


def comparison_columns(r: Comparison) -> tuple[str, ...]:
    """The heads of a comparison's table: arm, config, its figure (median of its turns), the CI, other load."""
    figure = ("batch-1 p50" if r.unit == SECONDS else r.unit) + " (median of its turns)"
    return ("arm", "config", figure, "95% CI", "other load")


def comparison_rows(r: Comparison) -> list[tuple[str, str, str, str, str]]:
    """One row of cells per arm (A, then B), as `comparison_columns` names them."""
    rows = []
    for name, arm in (("A", r.a), ("B", r.b)):
        config = arm.label or config_label(arm.config)
        digits = figure_decimals(arm.figure, arm.ci_low, arm.ci_high) if arm.figure else 0
        value = format_latency if r.unit == SECONDS else (lambda v, d=digits: f"{v:,.{d}f}")  # the digits its CI supports
        figure = value(arm.figure) if arm.figure is not None else arm.status
        ci = f"[{value(arm.ci_low)}, {value(arm.ci_high)}]" if arm.ci_low is not None else "-"
        load = f"{arm.other_load_cores:.1f} cores" if arm.other_load_cores is not None else "-"
        rows.append((name, config, figure, ci, load))
    return rows


def comparison_mode(r: Comparison) -> str:
    """How the arms were measured: in alternation (and what stopped it), or in separate runs and why."""
    if r.mode == "alternating":
        return (f"in alternation: turns of one length, A B A then B A B to a round, the other arm stopped; "
                f"stopped by {r.stopped_by}")
    return f"separate runs A B A B A B, because {r.mode_reason}"


def comparison_failures(r: Comparison) -> list[str]:
    """A line per arm that failed, with its status and error."""
    return [f"arm {name} {arm.status}: {arm.error}" for name, arm in (("A", r.a), ("B", r.b)) if not arm.ok and arm.error]
