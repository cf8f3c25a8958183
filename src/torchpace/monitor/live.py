"""Renderers for `torchpace monitor`: the live Rich view, plain periodic lines, the exit summary.

The `render_*` functions are pure (samples in, text or Rich renderables out); `LiveView` and
`PlainView` only decide when to print them. Both views receive the same calls from the monitor loop:
`start`, `on_sample`, `on_alert`, `on_output` (CMD's own terminal output in live mode) and `stop`.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Protocol, Sequence

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from torchpace.measure.render import format_bytes
from torchpace.monitor.samples import Sample
from torchpace.monitor.symptoms import AlertEvent

_SPARK_CHARS = "▁▂▃▄▅▆▇█"
_HISTORY_SAMPLES = 60  # a minute of sparkline at 1 Hz
_PLAIN_LINE_EVERY_S = 10.0  # a heartbeat for job logs; the CSV holds every sample
_HOT_PCT = 90.0  # at or above: drawn red, as the symptom rules call a core or GPU saturated there
_WARM_PCT = 50.0  # at or above: drawn yellow
_PROGRESS_REDRAW_S = 0.2  # a progress bar redrawn 100 times a second is shown 5 times a second


# --------------------------------------------------------------------------- formatting (pure)


def format_value(value: float | None, unit: str) -> str:
    """A metric value for people, by its unit (bytes scaled, shares as percent)."""
    if value is None:
        return "-"
    if unit == "bytes":
        return format_bytes(value)
    if unit == "bytes/s":
        return format_bytes(value) + "/s"
    if unit == "0-1":
        return f"{100 * value:.1f}%"
    if unit.startswith("%"):
        return f"{value:.1f}%"
    return f"{value:.4g}"


def render_sparkline(values: Sequence[float | None], lo: float = 0.0, hi: float | None = None) -> str:
    """One block character per value, scaled between `lo` and `hi` (default: the largest value)."""
    present = [v for v in values if v is not None]
    top = hi if hi is not None else max(present, default=0.0)
    span = top - lo
    chars = []
    for value in values:
        if value is None:
            chars.append(" ")
            continue
        level = 0 if span <= 0 else int((min(max(value, lo), top) - lo) / span * (len(_SPARK_CHARS) - 1) + 0.5)
        chars.append(_SPARK_CHARS[level])
    return "".join(chars)


def _style(pct: float) -> str:
    return "red" if pct >= _HOT_PCT else "yellow" if pct >= _WARM_PCT else "green"


def render_cores(core_pct: Sequence[float]) -> Text:
    """One coloured block per logical core, height = how busy it was."""
    text = Text()
    for pct in core_pct:
        text.append(render_sparkline([pct], 0.0, 100.0), style=_style(pct))
    return text


def render_gpu_plain(sample: Sample) -> str:
    """The GPUs' part of a plain line (empty without GPUs)."""
    parts = []
    for g in sample.gpus:
        throttle = f" [{','.join(g.throttle_reasons)}]" if g.throttle_reasons else ""
        parts.append(f"gpu{g.index} {format_value(g.util_pct, '%')} {format_bytes(g.mem_used_bytes)}/"
                     f"{format_bytes(g.mem_total_bytes)} {format_value(g.temp_c, 'C')}C "
                     f"{format_value(g.power_w, 'W')}W{throttle}")
    return " | ".join(parts)


def render_plain_line(sample: Sample) -> str:
    """One line per sample for logs: host CPU and I/O, CMD's tree, memory, GPUs."""
    line = (
        f"[{sample.t_s:8.1f}s] cpu {sample.cpu_pct:.0f}% iowait {sample.iowait_pct:.0f}% | "
        f"CMD {sample.tree_cpu_pct / 100:.2f} cores {sample.tree_procs} procs {format_bytes(sample.tree_rss_bytes)} | "
        f"mem {format_bytes(sample.mem_used_bytes)}/{format_bytes(sample.mem_total_bytes)} | "
        f"disk r {format_value(sample.disk_read_bytes_per_s, 'bytes/s')} "
        f"w {format_value(sample.disk_write_bytes_per_s, 'bytes/s')} | "
        f"net rx {format_value(sample.net_recv_bytes_per_s, 'bytes/s')} "
        f"tx {format_value(sample.net_sent_bytes_per_s, 'bytes/s')}"
    )
    gpus = render_gpu_plain(sample)
    return f"{line} | {gpus}" if gpus else line


def render_alert_line(event: AlertEvent) -> str:
    """An alert raised or cleared, as one line (with the remedy when raised)."""
    finding = event.finding
    if event.kind == "cleared":
        return f"[{event.t_s:8.1f}s] cleared {finding.id}: {finding.title}"
    remedy = f" Remedy: {finding.remedy.text}" if finding.remedy else ""
    return f"[{event.t_s:8.1f}s] ALERT {finding.id}: {finding.title}. {finding.evidence}.{remedy}"


# --------------------------------------------------------------------------- live view (pure)


def _row(table: Table, label: str, now: str, values: Sequence[float | None], hi: float | None = None) -> None:
    table.add_row(label, now, Text(render_sparkline(values, 0.0, hi), style="cyan"))


def _add_gpu_rows(table: Table, history: Sequence[Sample]) -> None:
    last = history[-1]
    for g in last.gpus:
        series = [s.gpus[g.index] if g.index < len(s.gpus) else None for s in history]
        _row(table, f"GPU {g.index} util", format_value(g.util_pct, "%"), [x.util_pct if x else None for x in series], 100.0)
        _row(table, f"GPU {g.index} memory", f"{format_bytes(g.mem_used_bytes)} / {format_bytes(g.mem_total_bytes)}",
             [x.mem_used_frac if x else None for x in series], 1.0)
        throttle = ", ".join(g.throttle_reasons) or "no throttling"
        table.add_row(f"GPU {g.index} state", f"{format_value(g.temp_c, 'C')} °C  {format_value(g.power_w, 'W')} W",
                      f"SM {format_value(g.sm_clock_mhz, 'MHz')} MHz, {throttle}")


def _add_host_rows(table: Table, history: Sequence[Sample], usable_cores: int) -> None:
    last = history[-1]
    table.add_row("cores", f"{last.cpu_pct:.0f}% host", render_cores(last.cpu_core_pct))
    _row(table, "CMD CPU", f"{last.tree_cpu_pct / 100:.2f} of {usable_cores} cores",
         [s.tree_cpu_pct for s in history], 100.0 * usable_cores)
    _row(table, "CMD memory", f"{format_bytes(last.tree_rss_bytes)} ({last.tree_procs} procs, {last.tree_threads} thr)",
         [s.tree_rss_bytes for s in history])
    _row(table, "iowait", f"{last.iowait_pct:.1f}%", [s.iowait_pct for s in history], 100.0)
    _row(table, "host memory", f"{format_bytes(last.mem_used_bytes)} / {format_bytes(last.mem_total_bytes)}",
         [s.mem_used_bytes / s.mem_total_bytes if s.mem_total_bytes else None for s in history], 1.0)
    _row(table, "disk read/write", f"{format_value(last.disk_read_bytes_per_s, 'bytes/s')} / "
         f"{format_value(last.disk_write_bytes_per_s, 'bytes/s')}",
         [s.disk_read_bytes_per_s + s.disk_write_bytes_per_s for s in history])
    _row(table, "net rx/tx", f"{format_value(last.net_recv_bytes_per_s, 'bytes/s')} / "
         f"{format_value(last.net_sent_bytes_per_s, 'bytes/s')}",
         [s.net_recv_bytes_per_s + s.net_sent_bytes_per_s for s in history])


def render_live_view(history: Sequence[Sample], active_alerts: Sequence[AlertEvent], usable_cores: int,
                     title: str, progress: str = "") -> RenderableType:
    """The live panel: a row per metric with its value now and a sparkline of recent samples."""
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 1))
    table.add_column("metric", style="bold", no_wrap=True)
    table.add_column("now", justify="right", no_wrap=True)
    table.add_column("history")
    if not history:
        table.add_row("", "waiting for the first sample", "")
        return table
    _add_gpu_rows(table, history)
    _add_host_rows(table, history, usable_cores)
    parts: list[RenderableType] = [table]
    for event in active_alerts:
        parts.append(Text(f"! {event.finding.title}: {event.finding.evidence}", style="bold yellow"))
    if progress:
        parts.append(Text.from_ansi(progress[-200:], no_wrap=True, overflow="ellipsis"))
    return Group(*parts)


# --------------------------------------------------------------------------- the views (effects)


class View(Protocol):
    """What the monitor loop calls; see the module docstring."""

    def start(self) -> None: ...

    def on_sample(self, sample: Sample) -> None: ...

    def on_alert(self, event: AlertEvent) -> None: ...

    def on_output(self, lines: list[str], progress: str | None) -> None: ...

    def stop(self) -> None: ...


class PlainView:
    """Plain lines: one every `every_s` seconds of samples (and the first), alerts as they happen.

    CMD keeps the terminal: its output never passes through here.
    """

    def __init__(self, console: Console, every_s: float = _PLAIN_LINE_EVERY_S):
        self._console = console
        self._every_s = every_s
        self._last_line_s: float | None = None

    def start(self) -> None:
        return None

    def on_sample(self, sample: Sample) -> None:
        if self._last_line_s is None or sample.t_s - self._last_line_s >= self._every_s - 1e-6:
            self._last_line_s = sample.t_s
            self._print("torchpace " + render_plain_line(sample))

    def on_alert(self, event: AlertEvent) -> None:
        self._print("torchpace " + render_alert_line(event))

    def on_output(self, lines: list[str], progress: str | None) -> None:
        for line in lines:
            self._console.out(line, highlight=False)

    def stop(self) -> None:
        return None

    def _print(self, line: str) -> None:
        self._console.print(line, markup=False, highlight=False, soft_wrap=True)


class LiveView:
    """A Rich `Live` panel redrawn on every sample; CMD's output lines scroll above it.

    Lines CMD ends with ``\\r`` (progress bars) are shown at the panel's foot instead. Output comes in
    batches (one per read of CMD's pipe), and progress redraws at most every `_PROGRESS_REDRAW_S`, so
    a chatty CMD costs one re-render per batch, not one per line.
    """

    def __init__(self, console: Console, title: str, usable_cores: int, history: int = _HISTORY_SAMPLES):
        self._console = console
        self._title = title
        self._usable_cores = usable_cores
        self._history: collections.deque[Sample] = collections.deque(maxlen=history)
        self._active: dict[str, AlertEvent] = {}
        self._progress = ""
        self._last_redraw_s = 0.0
        self._live: Any = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False,
                               redirect_stderr=False)

    def start(self) -> None:
        self._live.start()
        self._redraw()

    def on_sample(self, sample: Sample) -> None:
        self._history.append(sample)
        self._redraw()

    def on_alert(self, event: AlertEvent) -> None:
        if event.kind == "raised":
            self._active[event.finding.id] = event
        else:
            self._active.pop(event.finding.id, None)
        self._live.console.print("torchpace " + render_alert_line(event), markup=False, highlight=False)
        self._redraw()

    def on_output(self, lines: list[str], progress: str | None) -> None:
        if lines:
            # `out` passes CMD's text (and its colour codes) through as it is, ~4x faster than `print`;
            # Live redraws the panel below it once per batch.
            self._live.console.out("\n".join(lines), highlight=False)
        if progress is not None:
            self._progress = progress
            if time.monotonic() - self._last_redraw_s >= _PROGRESS_REDRAW_S:
                self._redraw()

    def stop(self) -> None:
        self._live.stop()

    def _redraw(self) -> None:
        self._last_redraw_s = time.monotonic()
        view = render_live_view(list(self._history), list(self._active.values()), self._usable_cores,
                                self._title, self._progress)
        self._live.update(view, refresh=True)


# --------------------------------------------------------------------------- exit summary (pure)


def render_summary(summary: dict[str, Any]) -> RenderableType:
    """The exit summary from `build_summary`'s dict: metrics table, alerts table, notes, totals."""
    parts: list[RenderableType] = [_render_metrics(summary)]
    if summary["alerts"]:
        parts.append(_render_alerts(summary["alerts"]))
    else:
        parts.append(Text("No symptom alerts.", style="green"))
    for note in summary["notes"]:
        parts.append(Text(f"note: {note['title']} ({note['evidence']})", style="dim"))
    parts.append(Text(render_totals_line(summary)))
    return Group(*parts)


def _render_metrics(summary: dict[str, Any]) -> Table:
    table = Table(title=f"torchpace monitor: {summary['samples']} samples every {summary['interval_s']:g} s",
                  title_justify="left")
    for name, justify in (("metric", "left"), ("unit", "left"), ("mean", "right"), ("p95", "right"), ("max", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for metric in summary["metrics"]:
        unit = metric["unit"]
        table.add_row(metric["name"], unit, *(format_value(metric[k], unit) for k in ("mean", "p95", "max")))
    return table


def _render_alerts(alerts: list[dict[str, Any]]) -> Table:
    table = Table(title="Alerts", title_justify="left")
    for name in ("raised", "cleared", "alert", "evidence", "remedy"):
        table.add_column(name, no_wrap=name in ("raised", "cleared"))
    for alert in alerts:
        data = alert["data"]
        cleared = data["cleared_at_s"]
        table.add_row(f"{data['raised_at_s']:.1f} s", "-" if cleared is None else f"{cleared:.1f} s",
                      alert["title"], alert["evidence"],
                      (alert["remedy"] or {}).get("text", ""))
    return table


def render_totals_line(summary: dict[str, Any]) -> str:
    """CMD's exit code and run time, and what sampling cost."""
    sampler = summary["sampler"]
    line = (f"CMD exited with code {summary['exit_code']} after {summary['wall_s']:.1f} s. "
            f"Sampler thread: {sampler['cpu_s']:.3f} s CPU over {sampler['wall_s']:.1f} s "
            f"= {sampler['core_pct']:.3f}% of one core.")
    if summary["signals_forwarded"]:
        line += f" Forwarded to CMD: {', '.join(summary['signals_forwarded'])}."
    if summary["leftover_processes_stopped"]:
        line += f" Stopped {summary['leftover_processes_stopped']} process(es) CMD left running."
    return line
