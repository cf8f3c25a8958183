"""Renderers: plain lines, sparklines, the live panel and the exit summary, rendered to text."""

from __future__ import annotations

import io

from rich.console import Console

from torchpace.findings import Finding, Remedy, Severity
from torchpace.monitor.live import (
    LiveView,
    PlainView,
    format_bytes,
    render_live_view,
    render_plain_line,
    render_sparkline,
    render_summary,
)
from torchpace.monitor.symptoms import AlertEvent


def _console(terminal: bool = False) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=160, color_system=None), out


def _text(renderable) -> str:
    console, out = _console()
    console.print(renderable)
    return out.getvalue()


ALERT = Finding("monitor.storage_bound", Severity.WARN, "Storage-bound: tasks wait on the disk",
                evidence="iowait 40% (>= 20%)", remedy=Remedy("copy the dataset to local NVMe"), area="io",
                data={"onset_s": 2.0, "raised_at_s": 6.0, "cleared_at_s": None, "raise_after_samples": 5})


def test_sparkline_scales_between_bounds():
    assert render_sparkline([0, 50, 100], 0, 100) == "▁▅█"
    assert render_sparkline([None, 1.0]) == " █" and render_sparkline([0, 0]) == "▁▁"


def test_format_bytes():
    assert [format_bytes(v) for v in (None, 512, 1536, 3 * 2**30)] == ["-", "512 B", "1.5 KiB", "3.0 GiB"]


def test_plain_line_names_host_tree_and_gpus(make_sample):
    line = render_plain_line(make_sample(t_s=12.0, tree_cpu_pct=195.0, tree_procs=3,
                                         gpu={"throttle_reasons": ("hw_thermal",)}))
    assert "[    12.0s]" in line and "CMD 1.95 cores 3 procs" in line
    assert "gpu0 95.0% 20.0 GiB/80.0 GiB 60C 300W [hw_thermal]" in line


def test_plain_view_prints_a_heartbeat_not_every_sample(make_sample):
    console, out = _console()
    view = PlainView(console, every_s=10.0)
    for t in range(1, 25):
        view.on_sample(make_sample(t_s=float(t)))
    view.on_alert(AlertEvent("raised", 24.0, ALERT))
    lines = out.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines[:3]] == ["torchpace [     1.0s", "torchpace [    11.0s",
                                                         "torchpace [    21.0s"]
    assert "ALERT monitor.storage_bound" in lines[3] and "Remedy: copy the dataset" in lines[3]


def test_live_panel_shows_metrics_cores_alerts_and_progress(make_sample):
    history = [make_sample(t_s=float(t), tree_cpu_pct=100.0 * t) for t in (1, 2, 3)]
    text = _text(render_live_view(history, [AlertEvent("raised", 3.0, ALERT)], usable_cores=4, title="T",
                                  progress="epoch 1: 40%"))
    for expected in ("GPU 0 util", "95.0%", "cores", "CMD CPU", "3.00 of 4 cores", "host memory",
                     "disk read/write", "! Storage-bound", "epoch 1: 40%"):
        assert expected in text, expected
    assert "waiting for the first sample" in _text(render_live_view([], [], 4, "T"))


def test_live_view_prints_cmd_output_above_the_panel(make_sample):
    console, out = _console(terminal=True)
    view = LiveView(console, "title", usable_cores=2)
    view.start()
    view.on_output(["hello from CMD", "second line"], None)
    view.on_output([], "step 3/10")
    view.on_sample(make_sample(t_s=1.0))
    view.stop()
    text = out.getvalue()
    assert "hello from CMD" in text and "second line" in text and "step 3/10" in text and "CMD CPU" in text


def test_summary_lists_metrics_alerts_notes_and_cost():
    summary = {
        "samples": 30, "interval_s": 1.0, "exit_code": 3, "wall_s": 30.2,
        "metrics": [{"name": "tree_cpu_pct", "unit": "% of one core", "mean": 150.0, "p95": 199.0, "max": 200.0},
                    {"name": "disk_write_bytes_per_s", "unit": "bytes/s", "mean": 2**20, "p95": 2**21, "max": 2**22}],
        "alerts": [ALERT.to_dict()],
        "notes": [{"title": "GPU not sampled", "evidence": "no NVML"}],
        "sampler": {"cpu_s": 0.05, "wall_s": 30.0, "core_pct": 0.1667},
        "signals_forwarded": ["SIGTERM"], "leftover_processes_stopped": 2,
    }
    text = _text(render_summary(summary))
    for expected in ("30 samples every 1 s", "tree_cpu_pct", "150.0%", "4.0 MiB/s", "6.0 s", "Storage-bound",
                     "copy the dataset", "GPU not sampled", "exited with code 3", "0.167% of one core",
                     "Forwarded to CMD: SIGTERM", "Stopped 2 process(es)"):
        assert expected in text, expected
