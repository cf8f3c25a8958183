"""`torchpace report`: one self-contained HTML file of a study, a bench or a profile result.

Three layers, as everywhere in torchpace:

- `load` reads a study (Optuna storage) or a result JSON into a frozen `ReportData`, and `doctor`
  adds the doctor's findings that are not ok (effects);
- `view` decides what to show and formats it (pure); `charts` draws it as inline SVG;
- `render` puts both through a Jinja2 template with inline CSS and writes the file.

Importing this package imports nothing heavy; matplotlib and Jinja2 load when a report is rendered.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from torchpace.report.load import build_tune_data, mask_url
from torchpace.report.render import render_html, save_report

if TYPE_CHECKING:
    from torchpace.report.load import ReportData
    from torchpace.tune.outcome import TuneOutcome


def write_report(data: "ReportData", path: str | Path, *, with_doctor: bool = True,
                 generated_at: datetime | None = None) -> Path:
    """Render `data` (with the doctor's findings unless `with_doctor` is False) to HTML at `path`, stamped
    `generated_at` (default: now).

    Returns:
        The path written.
    """
    if with_doctor:
        # lazy: the host's checks load only when the report includes them
        from torchpace.report.doctor import collect_doctor_summary

        data = dataclasses.replace(data, doctor=collect_doctor_summary(data.host))
    return save_report(render_html(data, generated_at), path)


def report_data_from_tune(outcome: "TuneOutcome", host: Mapping[str, Any] | None) -> "ReportData":
    """ReportData of a tune that just ran (its outcome and `HostFacts.summary()`)."""
    source = f"{mask_url(outcome.storage)} (study {outcome.study!r})"
    return build_tune_data(outcome, host, source)


__all__ = ["write_report", "report_data_from_tune"]
