"""The report as one self-contained HTML file: the view and the charts through a Jinja2 template.

The template (`templates/report.html.j2`) carries its CSS inline, print rules included, and the
charts are inline SVG: the file needs no network and no other file, so it can be attached to a
ticket and opened anywhere. Autoescaping is on for everything but the SVG, which `charts` builds.
"""

from __future__ import annotations

from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

from torchpace._version import __version__
from torchpace.files import write_atomic
from torchpace.measure.render import config_label
from torchpace.redact import redact_data
from torchpace.report import charts
from torchpace.report.load import ReportData
from torchpace.report.view import build_view, guard_curves, tuned_row
from torchpace.tune.outcome import TuneOutcome

TEMPLATE = "report.html.j2"
CHART_NAMES = ("speed", "waterfall", "trials", "losses", "windows", "split")


def build_charts(data: ReportData) -> dict[str, str]:
    """Every chart the data supports, name -> SVG (matplotlib is imported here, on first use)."""
    svgs: dict[str, str] = {}
    if data.tune:
        svgs.update(_tune_charts(data.tune))
    if data.bench and data.bench.throughput.window_rates:
        svgs["windows"] = charts.render_windows_svg(data.bench)
    if data.profile:
        split = data.profile.step_split
        if split:
            svgs["split"] = charts.render_split_svg(split)
    return svgs


def _tune_charts(tune: TuneOutcome) -> dict[str, str]:
    svgs: dict[str, str] = {}
    baseline = tune.baseline
    if baseline and baseline.throughput and baseline.throughput.value:
        tuned = tuned_row(tune)
        ranged = baseline.measurements or (tuned is not None and tuned.measurements)
        svgs["speed"] = charts.render_speed_svg(baseline.throughput, tuned.throughput if tuned else None,
                                                interval="range of every measurement" if ranged else "95% CI",
                                                baseline_label=config_label({}, bool(tune.command)))
        if tune.stepwise:  # a search accepts nothing step by step: no waterfall
            svgs["waterfall"] = charts.render_waterfall_svg(tune.accepted, tune.speedup or 1.0)
    if tune.trials:
        svgs["trials"] = charts.render_trials_svg(tune.trials, baseline.throughput if baseline else None, tune.unit)
    base_losses, tuned_losses, rejected = guard_curves(tune)
    if base_losses:
        svgs["losses"] = charts.render_losses_svg(base_losses, tuned_losses, rejected)
    return svgs


def render_html(data: ReportData, generated_at: datetime | None = None) -> str:
    """The report's HTML text."""
    # lazy: the template engine loads only when a page is rendered
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(_template_text())
    view: dict[str, Any] = redact_data(build_view(data))  # before HTML escapes the quotes a secret's mask looks for
    svgs = build_charts(data)
    view["charts"] = {name: Markup(svgs[name]) if name in svgs else None for name in CHART_NAMES}
    view["generated_at"] = (generated_at or datetime.now().astimezone()).strftime("%Y-%m-%d %H:%M %Z").strip()
    view["version"] = __version__
    return template.render(**view)


def _template_text() -> str:
    return (files("torchpace.report") / "templates" / TEMPLATE).read_text(encoding="utf-8")


def save_report(html: str, path: str | Path) -> Path:
    """Write the HTML atomically (`torchpace.files`: a temp file renamed over `path`; secrets masked).

    Raises:
        OutputWriteFailed: the file could not be written (full disk, permissions); nothing is left behind.
    """
    return write_atomic(path, html)
