"""What the report says, decided from `ReportData`: pure functions that pick and format.

`build_view` returns plain dicts and strings for the template; it never touches the world. The
selectors (`tuned_row`, `guard_curves`, `step_split`) are shared with the charts so a chart and the
table beside it always show the same trial.
"""

from __future__ import annotations

import shlex
from typing import Any, Mapping, Sequence

import tomli_w

from torchpace.config import SCHEMA_VERSION
from torchpace.host import HostSummary
from torchpace.knobs import REGISTRY
from torchpace.measure.comparison import Comparison
from torchpace.measure.render import (bench_rows, bench_warnings, comparison_columns, comparison_failures, comparison_mode,
                                      comparison_rows, config_label, format_bytes, step_time_text)
from torchpace.measure.result import BenchResult, Objective
from torchpace.measure.stats import ci_name, figure_text, ratio_text
from torchpace.profile.render import SHOWN_AS_TABLES, profile_warnings, split_rows, top_op_rows
from torchpace.profile.result import ProfileResult
from torchpace.report.load import ReportData
from torchpace.tune.figures import ReportedDecision, range_name, speedup
from torchpace.tune.outcome import AcceptedChange, TrialRow, TuneOutcome

DEFAULT_CONFIG_FILE = "torchpace.toml"
_SAME_CONFIG_GAP = 0.10  # two measurements of one config 10% apart: worth telling the reader it is noise
_MAX_REJECTED_CURVES = 4  # guard-rejected loss curves drawn beside baseline and tuned; more would hide them


# ---- selectors shared with the charts ---------------------------------------------------------------


def trial_stage(row: TrialRow) -> str:
    """The colour group of a trial: baseline (and re-measurements), its knob's stage, or search."""
    if row.kind in ("baseline", "remeasure"):
        return "baseline"
    return row.stage or "search"


def trial_label(row: TrialRow) -> str:
    """A short label of what a trial measured: `baseline`, `re-measure`, `knob=value` or its config."""
    if row.kind == "baseline":
        return "baseline"
    if row.kind == "remeasure":
        return "re-measure"
    if row.knob:
        return f"{row.knob.split('.')[-1]}={row.value}"
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in row.config.items()) or "defaults"


def is_failed(row: TrialRow) -> bool:
    """True for a trial without a usable figure: a failure class, or no throughput figure."""
    return row.status != "ok" or not (row.throughput and row.throughput.value)


def _ci_name(row: TrialRow | None) -> str:
    """What a row's interval is called: the range of the measurements it spans (a paired study's baseline and
    tuned rows: `tune.figures.config_range`), else a CI by the coverage it has over its windows (or turns:
    `measure.stats.ci_name`)."""
    if row is not None and row.measurements:
        return range_name(row.measurements)
    return ci_name(len(row.window_rates)) if row is not None and row.window_rates else "95% CI"


def tuned_row(tune: TuneOutcome) -> TrialRow | None:
    """The tuned config's measurement (None without a baseline to compare it with)."""
    return tune.best if tune.baseline else None


def guard_curves(tune: TuneOutcome) -> tuple[list[float], list[float] | None, list[tuple[str, list[float]]]]:
    """(baseline losses, tuned losses or None, [(label, losses)] of trials the guard rejected)."""
    baseline = list(tune.baseline.guard_losses) if tune.baseline else []
    tuned = tuned_row(tune)
    tuned_losses = list(tuned.guard_losses) if tuned and tune.best_config else None
    rejected = [(trial_label(t), list(t.guard_losses)) for t in tune.trials if t.guard == "fail" and t.guard_losses]
    return baseline, tuned_losses, rejected[:_MAX_REJECTED_CURVES]


# ---- formatting -------------------------------------------------------------------------------------


def format_figure(figure: Objective | None) -> str:
    """`12,345` samples/s, `7.9` steps/s: a figure's median in its unit, with the digits its CI supports
    (`measure.stats.figure_text`, as the terminal shows it); `-` without one."""
    if figure is None or figure.value is None:
        return "-"
    return figure_text(figure.value, figure.ci_low, figure.ci_high).partition(" ")[0]


def format_figure_ci(figure: Objective | None, with_value: bool = True) -> str:
    """`12,345 [12,001, 12,700]`: a figure and its 95% CI (or the CI alone); `-` when unknown."""
    if figure is None or figure.value is None:
        return "-"
    text = figure_text(figure.value, figure.ci_low, figure.ci_high)
    value, _, bounds = text.partition(" ")
    if not bounds:
        return value if with_value else "-"
    return text if with_value else bounds


def format_value(value: Any) -> str:
    """A knob value as the user writes it (`true`, `2`, `bf16`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "-" if value is None else str(value)


def workload_name(spec: str) -> str:
    """The short name of a workload spec (`path/file.py:fn` -> `fn`)."""
    return spec.rsplit(":", 1)[-1] if ":" in spec else spec


# ---- the whole view ---------------------------------------------------------------------------------


def build_view(data: ReportData) -> dict[str, Any]:
    """Everything the template shows, as plain values."""
    view: dict[str, Any] = {
        "title": f"torchpace {({'study': 'tune'}).get(data.kind, data.kind)} report: {workload_name(data.workload)}",
        "kind": data.kind, "source": data.source, "workload": data.workload, "note": data.note,
        "host_rows": host_rows(data.host), "doctor": data.doctor, "config": config_view(data),
        "tune": tune_view(data.tune) if data.tune else None,
        "bench": bench_view(data.bench) if data.bench else None,
        "compare": compare_view(data.compare) if data.compare else None,
        "profile": profile_view(data.profile) if data.profile else None,
    }
    view["cards"] = summary_cards(data)
    return view


def host_rows(stored: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(label, value) rows of the measured host's summary (`host.HostSummary`)."""
    if not stored:
        return []
    host = HostSummary.from_summary(stored)

    def shown(value: Any) -> str:
        return "?" if value is None else str(value)

    return [("CPU", f"{shown(host.cpu_model)} ({shown(host.usable_cores)} usable of {shown(host.logical_cpus)} logical "
                    f"CPUs, {shown(host.numa_nodes)} NUMA node(s))"),
            ("memory", format_bytes(host.memory_bytes)),
            ("GPUs", ", ".join(host.gpus) if host.gpus else "none"),
            ("OS", host.distro or "?"),
            ("torch", (host.torch_version or "?") + (f" (CUDA {host.cuda_version})" if host.cuda_version else "")),
            ("native bf16", "yes" if host.native_bf16 else "no"),
            ("host fingerprint", shown(host.fingerprint))]


def summary_cards(data: ReportData) -> list[dict[str, str]]:
    """The headline figures at the top of the report."""
    if data.tune:
        tune = data.tune
        failed = sum(1 for t in tune.trials if t.status != "ok" or t.guard == "fail")
        tuned = tuned_row(tune)
        base_figure, tuned_figure = (tune.baseline.throughput if tune.baseline else None), (tuned.throughput if tuned else None)
        return [
            {"label": f"baseline {tune.unit}", "value": format_figure(base_figure),
             "detail": f"{_ci_name(tune.baseline)} " + format_figure_ci(base_figure, with_value=False)},
            {"label": f"tuned {tune.unit}", "value": format_figure(tuned_figure),
             "detail": f"{_ci_name(tuned)} " + format_figure_ci(tuned_figure, with_value=False)},
            {"label": "speedup", "value": _speedup_value(tune),
             "detail": f"{len(tune.accepted)} accepted change(s)" if tune.stepwise
             else f"best trial of a {tune.strategy} search"},
            {"label": "trials", "value": str(len(tune.trials)), "detail": f"{failed} failed or guard-rejected · {stopped_text(tune)}"},
        ]
    if data.bench:
        b = data.bench
        rate = b.objective
        batch = "batch unknown" if b.step.batch_size is None else f"batch {b.step.batch_size}"
        return [{"label": rate.unit, "value": format_figure(rate), "detail": f"95% CI ±{b.throughput.ci_rel_halfwidth:.1%}"},
                {"label": "step time", "value": step_time_text(b.throughput), "detail": batch},
                {"label": "input-bound", "value": "-" if b.input_bound_frac is None else f"{b.input_bound_frac:.0%}",
                 "detail": "of the step waits for data"},
                {"label": "peak memory", "value": format_bytes(b.peak_memory_bytes), "detail": b.peak_memory_kind}]
    if data.compare:
        c = data.compare
        ratio = ratio_text(c.ratio, c.ratio_ci_low, c.ratio_ci_high, c.rounds).replace("x", "×", 1)
        return [{"label": "B / A", "value": ratio.partition(" ")[0].rstrip(","), "detail": ratio},
                {"label": "verdict", "value": c.verdict, "detail": c.mode},
                {"label": "wall time", "value": f"{c.wall_time_s:.0f} s", "detail": f"stopped by {c.stopped_by}"}]
    p = data.profile
    split = p.step_split if p else None
    return [{"label": "verdict", "value": p.verdict.kind.value if p else "-", "detail": f"{p.steps if p else '?'} profiled steps"},
            {"label": "step time", "value": f"{split.step_time_us / 1000:.1f} ms" if split else "-", "detail": "mean per step"},
            {"label": "device", "value": p.device if p else "-", "detail": ""}]


def _speedup_value(tune: TuneOutcome) -> str:
    """`1.32×`: the speedup with the digits its CI supports (the final comparison's, as the terminal shows it)."""
    if tune.speedup is None:
        return "-"
    figure = tune.speedup_figure
    low, high = (figure.ci_low, figure.ci_high) if figure is not None else (None, None)
    return ratio_text(tune.speedup, low, high).partition(" ")[0].replace("x", "×", 1)


# ---- tune -------------------------------------------------------------------------------------------


_STOPPED = {"done": "search complete", "budget": "stopped by the budget", "max-trials": "stopped at --max-trials",
            "interrupted": "interrupted", "unfinished": "search unfinished", "baseline failed": "baseline failed",
            "stored": "read from storage"}


def stopped_text(tune: TuneOutcome) -> str:
    """How the search ended, in words (a live tune's `stopped`, or what the stored replay found)."""
    return _STOPPED.get(tune.stopped, tune.stopped)


def tune_view(tune: TuneOutcome) -> dict[str, Any]:
    """The tune sections: result, accepted changes, decisions, trials, convergence."""
    baseline = tune.baseline
    best_losses = guard_curves(tune)[1]
    tuned = tuned_row(tune)
    return {
        "strategy": tune.strategy, "study": tune.study, "stepwise": tune.stepwise, "unit": tune.unit,
        "stopped": stopped_text(tune), "failed_baseline": tune.failed_baseline,
        "has_baseline": baseline is not None, "baseline": format_figure_ci(baseline.throughput if baseline else None),
        "baseline_label": tune.baseline_label, "unchanged": config_label({}, bool(tune.command)),
        "tuned": format_figure_ci(tuned.throughput if tuned else None),
        "baseline_memory": format_bytes(baseline.peak_memory_bytes if baseline else None),
        "tuned_memory": format_bytes(tuned.peak_memory_bytes if tuned else None),
        "speedup": tune.speedup,
        "accepted": [accepted_row(a) for a in tune.accepted],
        "decisions": [decision_row(d) for d in tune.decisions],
        "trials": [trial_row(t, baseline.throughput if baseline else None, bool(tune.command)) for t in tune.trials],
        "verdict": baseline.verdict if baseline else None,
        "guard_note": tune.guard_note,
        "has_curves": bool(guard_curves(tune)[0]),
        "tuned_is_baseline": best_losses is None,
        "tuned_guard": tuned.guard_reason if tuned and tune.best_config else None,
        "same_config_note": same_config_note(baseline, tuned, tune.best_config),
        "figures_note": tune.figures_note,
        "contention_note": tune.other_load.note if tune.other_load else None,
        "paired": paired_view(tune),
    }


def paired_view(tune: TuneOutcome) -> dict[str, Any] | None:
    """A paired study's speedup with its CI and source, and its A/A noise band (None for other studies)."""
    speedup, noise = tune.speedup_figure, tune.noise
    if speedup is None:
        return None
    return {"speedup": ratio_text(tune.speedup, speedup.ci_low, speedup.ci_high, speedup.rounds).replace("x", "×", 1),
            "source": speedup.source, "load_note": speedup.load_note,
            "noise": ratio_text(noise.ratio, noise.ratio_ci_low, noise.ratio_ci_high, noise.rounds).replace("x", "×", 1)
            if noise else None}


def same_config_note(baseline: TrialRow | None, tuned: TrialRow | None, best_config: Mapping[str, Any] | None) -> str | None:
    """When nothing was accepted, baseline and tuned are two measurements of one config: say how far apart."""
    base_figure, tuned_figure = (baseline.throughput if baseline else None), (tuned.throughput if tuned else None)
    if best_config or not base_figure or not tuned_figure or not base_figure.value or not tuned_figure.value:
        return None
    gap = abs(tuned_figure.value / base_figure.value - 1)
    if gap < _SAME_CONFIG_GAP:
        return None
    return (f"Nothing was accepted, so baseline and tuned are the same config measured twice; the two figures differ by "
            f"{gap:.0%}. That is this host's noise (other load, frequency scaling): the speedup stays 1.00×, and "
            "changes smaller than the noise cannot be told apart here.")


def accepted_row(a: AcceptedChange) -> dict[str, Any]:
    """One row of the accepted-change (waterfall) table; a paired step's gain with its CI."""
    gain = ratio_text(a.step_gain, a.step_gain_ci_low, a.step_gain_ci_high, a.rounds)
    return {"change": f"+ {a.knob} = {format_value(a.value)}", "stage": a.stage or "",
            "sps": format_figure_ci(a.throughput), "step_gain": gain.replace("x", "×", 1), "speedup": f"{a.speedup:.2f}×",
            "memory": format_bytes(a.peak_memory_bytes), "reason": a.reason, "load_note": a.load_note}


def decision_row(reported: ReportedDecision) -> dict[str, Any]:
    """One knob the greedy search decided on: accepted value or rejected (or not judged), the deciding
    comparison's ratio with its CI, and why."""
    d = reported.decision
    accepted = d.accepted_value is not None
    outcome = f"accepted = {format_value(d.accepted_value)}" if accepted else "kept default" if d.judged else "not judged"
    return {"stage": d.stage or "", "knob": d.knob, "outcome": outcome, "accepted": accepted,
            "ratio": ratio_text(d.ratio, d.ratio_ci_low, d.ratio_ci_high, d.rounds).replace("x", "×", 1),
            "reason": d.reason, "load_note": reported.load_note}


def trial_row(t: TrialRow, baseline: Objective | None, script: bool = False) -> dict[str, Any]:
    """One row of the every-trial table."""
    figure = t.throughput if not is_failed(t) else None
    if t.status != "ok":
        failure, reason = t.status, t.error or ""
    elif t.guard == "fail":
        failure, reason = "guard", t.guard_reason or ""
    else:
        failure, reason = "", ""
    vs_baseline = speedup(figure, baseline)
    return {
        "number": t.number, "slot": t.slot, "stage": t.stage or ("baseline" if t.kind != "candidate" else ""),
        "knob": t.knob or ("(re-measure)" if t.kind == "remeasure" else f"({config_label({}, script)})" if not t.config else ""),
        "value": format_value(t.value) if t.knob else ", ".join(f"{k}={format_value(v)}" for k, v in t.config.items()),
        "sps": format_figure_ci(figure) if figure else "-",
        "speedup": f"{vs_baseline:.2f}×" if vs_baseline else "-",
        "memory": format_bytes(t.peak_memory_bytes), "guard": t.guard or "-",
        "failure": failure, "reason": reason, "failed": bool(failure),
    }


# ---- bench and profile ------------------------------------------------------------------------------


def bench_view(bench: BenchResult) -> dict[str, Any]:
    """The bench section: its figures as (label, value) rows and the noise warning."""
    return {"rows": bench_rows(bench), "noisy": " ".join(bench_warnings(bench)) or None, "device": bench.device,
            "has_windows": bool(bench.throughput.window_rates), "unit": bench.objective.unit}


def compare_view(comparison: Comparison) -> dict[str, Any]:
    """The comparison section: each arm's cells as the terminal shows them, the verdict, how it was measured."""
    return {"columns": comparison_columns(comparison), "rows": comparison_rows(comparison),
            "summary": comparison.summary, "mode": comparison_mode(comparison), "load_note": comparison.other_load_note,
            "failures": comparison_failures(comparison),
            "ratios": ", ".join(f"{ratio:.3f}" for ratio in comparison.ratios) or "none"}


def profile_view(profile: ProfileResult) -> dict[str, Any]:
    """The profile section: verdict, evidence, remedies, the split table, other findings, top operators."""
    verdict = profile.verdict
    return {"noisy": " ".join(profile_warnings(profile)) or None,
        "kind": verdict.kind.value, "evidence": list(verdict.evidence), "also": [kind.value for kind in verdict.also],
        "remedies": [remedy.to_dict() for remedy in verdict.remedies],
        "not_offered": [{"knob": knob, "reason": why} for knob, why in verdict.not_offered],
        "knobs_to_try": list(verdict.knobs_to_try), "stages_to_try": list(verdict.stages_to_try),
        "device": profile.device, "steps": profile.steps,
        "split_rows": [row[:3] for row in split_rows(profile)], "top_ops": top_op_rows(profile), "trace_path": profile.trace_path,
        "findings": sorted_findings([f.to_dict() for f in profile.findings if f.id not in SHOWN_AS_TABLES]),
    }


# ---- config and how to apply it ---------------------------------------------------------------------


def config_view(data: ReportData) -> dict[str, Any]:
    """The final config as rows, as TOML, and as copy-ready snippets: for an unmodified script the
    `torchpace launch` line of the very command that was measured; for a Workload the `prepare()` code."""
    config = dict(data.config)
    rows = [{"knob": name, "value": format_value(value),
             "default": format_value(REGISTRY[name].default) if name in REGISTRY else "?",
             "point": REGISTRY[name].point.value if name in REGISTRY else "?"} for name, value in config.items()]
    needs_prepare = [name for name, value in config.items()
                     if name not in REGISTRY or REGISTRY[name].script_reach is None or REGISTRY[name].script_reason(value)]
    path = data.config_path or DEFAULT_CONFIG_FILE
    command = list(data.command) if data.command else ["train.py"]
    compared = data.kind == "compare"  # B's config; what ran (a Workload or a script) is not recorded
    return {"rows": rows, "empty": not config, "path": path, "saved": data.config_path is not None, "compared": compared,
            "toml": config_toml(config), "python": None if data.command or compared else python_snippet(data, config),
            "script": data.command is not None,
            "launch": shlex.join(["torchpace", "launch", "--config", path, "--", *command]), "needs_prepare": needs_prepare}


def config_toml(config: Mapping[str, Any]) -> str:
    """`config` as the torchpace.toml that `--config` and `prepare()` read."""
    return tomli_w.dumps({"schema_version": SCHEMA_VERSION, "knobs": dict(sorted(config.items()))})


def python_snippet(data: ReportData, config: Mapping[str, Any]) -> str:
    """Copy-ready code that runs the config through `torchpace.prepare()` in the user's own loop."""
    literal = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in config.items()) + "}"
    source = "the workload tune measured" if data.kind == "study" else f"the workload you measured ({data.workload})"
    return (
        "import torchpace\n\n"
        f"workload = torchpace.load_workload({data.workload!r})  # {source}; or your own torchpace.Workload(...)\n"
        f"config = {literal}  # or the path of a torchpace.toml\n"
        "with torchpace.prepare(workload, config) as run:\n"
        "    for batch in run.loader:\n"
        "        loss = run.step(batch)\n"
    )


def sorted_findings(findings: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Findings worst first (fail, warn, info, ok), stable within a severity."""
    order = {"fail": 0, "warn": 1, "info": 2, "ok": 3}
    return sorted(findings, key=lambda f: order.get(f.get("severity"), 4))
