"""`torchpace tune [WORKLOAD | -- python train.py ARGS]`: one knob at a time, keep what is faster and still converges."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import click

from torchpace.cli._common import check_outputs, emit_json, study_file, json_option, make_console
from torchpace.cli._options import MAX_SECONDS, SECONDS, FiniteFloat, objective_option, workload_argument, workload_inputs
from torchpace.cli._script import (ScriptVerb, check_script_options, samples_per_step_option, script_command,
                                     script_inputs, script_sources, show_output_option)
from torchpace.errors import UsageError
from torchpace.stop_policy import stop_exit_code, stop_reason
from torchpace.tune.guard import MAX_GUARD_STEPS

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
# more trials than any search here holds (the knobs' values, each tried once, number in the tens): a larger
# cap is a slip, and the budget ends a tune long before
MAX_TRIALS = 100_000


def parse_duration_s(text: str) -> float:
    """`90`, `90s`, `15m`, `1.5h` -> seconds, at most a week (`MAX_SECONDS`); UsageError otherwise."""
    match = _DURATION.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"--budget {text!r} is not a duration; use e.g. 90s, 15m or 1h")
    seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if seconds > MAX_SECONDS:
        raise UsageError(f"--budget {text!r} is {seconds:g} s, more than a week ({MAX_SECONDS:g} s = "
                         f"{MAX_SECONDS / 3600:g}h); give at most {MAX_SECONDS / 3600:g}h")
    return seconds


def _check_study_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--study: a name a study can have (`tune.study.check_study_name`), checked before anything starts."""
    if value is None:
        return None
    # lazy: `torchpace tune --help` loads this module; the verb's work loads only when it runs
    from torchpace.tune.study import check_study_name

    return check_study_name(value)


@click.command("tune", cls=ScriptVerb)
@workload_argument
@click.option("--budget", default="15m", show_default=True, help="Wall-time budget: 90s, 15m, 1h.")
@click.option("--max-trials", type=click.IntRange(1, MAX_TRIALS), default=None, help="Stop after this many trials (this session).")
@click.option("--strategy", type=click.Choice(["greedy", "tpe", "random", "grid"]), default="greedy", show_default=True)
@click.option("--storage", default=None, help="Optuna RDB URL (default: sqlite file .torchpace/studies.db here).")
@click.option("--study", "study_name", default=None, callback=_check_study_name,
              help="Study name (default: torchpace-WORKLOAD).")
@click.option("--resume", is_flag=True, help="Continue an existing study; finished trials are never re-run.")
@click.option("--out", "out_path", default="torchpace.toml", show_default=True, type=click.Path(dir_okay=False))
@click.option("--guard-steps", type=click.IntRange(0, MAX_GUARD_STEPS), default=30, show_default=True,
              help=f"Seeded steps compared against the baseline's loss curve (0: no guard; at most {MAX_GUARD_STEPS}).")
@click.option("--trial-time", type=SECONDS, default=20.0, show_default=True, help="Measurement cap per trial, seconds.")
@click.option("--knob", "knob_names", multiple=True, help="Tune only these knobs (repeatable).")
@objective_option("Maximise samples/s at the batch size, or minimise batch-1 p50 latency (inference workloads).")
@click.option("--accuracy-rtol", type=FiniteFloat(0, 1), default=0.05, show_default=True,
              help="Inference: max output error vs the fp32 eager reference, relative to its largest output (0 to 1).")
@click.option("--min-top1", "min_top1", type=FiniteFloat(0, 1), default=0.99, show_default=True,
              help="Inference classifiers: least share of samples whose top-1 class matches the fp32 reference.")
@click.option("--export", "export_path", type=click.Path(dir_okay=False), default=None,
              help="Inference: write the tuned model here (torch.export .pt2; TorchScript where export fails).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Also write an HTML report of the tune here (as `torchpace report` does).")
@click.option("--run-on", "run_on", type=FiniteFloat(min=0, max=MAX_SECONDS), default=120.0, show_default=True,
              help="Script mode: before --out is written, run the tuned config past its measured steps for up to this "
                   "long, through the script's first save or evaluation (0: no such run).")
@samples_per_step_option
@show_output_option
@json_option
def command(workload, budget, max_trials, strategy, storage, study_name, resume, out_path, guard_steps, trial_time,
            knob_names, objective, accuracy_rtol, min_top1, export_path, report_path, run_on, samples_per_step, show_output,
            as_json):
    """Tune WORKLOAD (default: the built-in `tabular`), or an unmodified training script given after
    `--` (`torchpace tune -- python train.py ARGS`): baseline, then one knob at a time.

    Each trial is its own process; failures (oom, crash, timeout, nonfinite, guard, invalid) are
    recorded and the search goes on. Writes the best config to --out. A script is tuned on the knobs
    that reach it unchanged (`torchpace knobs -- CMD` lists them); `torchpace launch --config
    torchpace.toml -- python train.py ARGS` then runs it as it was measured.
    """
    # lazy: `torchpace tune --help` loads this module; the verb's work loads only when it runs
    from torchpace.host import probe_host
    from torchpace.knobs import get_knob
    from torchpace.tune.tuner import TuneOptions, Tuner

    budget_s = parse_duration_s(budget)
    command_argv = script_command(workload)
    check_script_options(command_argv, show_output, samples_per_step)
    inputs = script_inputs(command_argv, None) if command_argv else workload_inputs(workload)
    check_outputs({"--out": out_path, "--export": export_path, "--report": report_path},
                  [*inputs, ("the study storage", study_file(storage))],
                  source_dirs=script_sources(command_argv) if command_argv else ())
    knobs = frozenset(get_knob(name).name for name in knob_names) or None
    options = TuneOptions(workload=workload, command=tuple(command_argv or ()), samples_per_step=samples_per_step,
                          show_output=show_output, budget_s=budget_s, max_trials=max_trials, strategy=strategy, storage=storage,
                          study=study_name, resume=resume, out=Path(out_path), guard_steps=guard_steps,
                          trial_time_s=trial_time, knobs=knobs, objective=objective, accuracy_rtol=accuracy_rtol,
                          min_top1_agreement=min_top1, export_path=Path(export_path) if export_path else None,
                          run_on_s=run_on)
    with _progress(not as_json and not show_output, budget_s) as on_event:  # SIGTERM and Ctrl-C raise (run_cli's signal policy)
        tuner = Tuner(options, probe_host(), on_event=on_event)
        try:
            outcome = tuner.run()
        except KeyboardInterrupt as stop:
            outcome = tuner.outcome
            why = stop_reason(stop)
            click.echo(f"{why}: the best config so far was written" if outcome.out_path else why, err=True)
            _report(outcome, as_json)
            _write_html_report(outcome, tuner.host, report_path)
            _raise_write_failure(tuner)
            return stop_exit_code(stop)
    _report(outcome, as_json)
    _write_html_report(outcome, tuner.host, report_path)
    _raise_write_failure(tuner)
    return 1 if outcome.failed_baseline or (outcome.export and outcome.export.error) else 0


def _raise_write_failure(tuner) -> None:
    """--out could not be written (a full disk): after the outcome was reported, its one line, exit 1."""
    if tuner.write_failure is not None:
        raise tuner.write_failure


def _write_html_report(outcome, host, report_path: str | None) -> None:
    """`--report`: the HTML report of this tune; the message goes to stderr so `--json` stays clean."""
    if report_path is None:
        return
    # lazy: `torchpace tune --help` loads this module; the verb's work loads only when it runs
    from torchpace.report import report_data_from_tune, write_report

    path = write_report(report_data_from_tune(outcome, host.summary()), report_path)
    click.echo(f"wrote report {path}", err=True)


def _report(outcome, as_json: bool) -> None:
    if as_json:
        emit_json(outcome.to_dict())
    else:
        # lazy: `torchpace tune --help` loads this module; the verb's work loads only when it runs
        from torchpace.tune.render import render_outcome

        render_outcome(make_console(), outcome)


def _say_notices(kind, **data):
    """Events every user sees on stderr, with or without the progress bar (e.g. waiting for a locked storage)."""
    if kind == "notice":
        click.echo(f"torchpace: {data['message']}", err=True)


class _progress:
    """Rich progress over the budget on stderr: stage, knob=value, trial, best so far, budget left."""

    def __init__(self, enabled: bool, budget_s: float):
        self.enabled = enabled and sys.stderr.isatty()
        self.budget_s = budget_s
        self.best, self.unit = None, "samples/s"
        self.what = ""  # the running trial's stage: knob=value

    def __enter__(self):
        if not self.enabled:
            return _say_notices

        # lazy: `torchpace tune --help` loads this module; the verb's work loads only when it runs
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.start = time.monotonic()
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[best]}"),
                                 TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=self.budget_s, best="")
        return self.on_event

    def on_event(self, kind, **data):
        if kind == "notice":
            return _say_notices(kind, **data)
        assignment = data.get("assignment")
        what = (f"{assignment.stage}: {assignment.knob}={assignment.value}" if assignment.knob else assignment.slot or "") \
            if assignment else ""
        figure = data["result"].bench.objective if kind == "trial_done" and data["result"].bench else None
        if figure is not None and figure.value and (self.best is None or figure.value > self.best.value):
            self.best = figure
        if kind == "trial_start":
            self.what = what
        # lazy: `torchpace tune --help` loads this module; the verb's work loads only when it runs
        from torchpace.measure.stats import figure_text, ratio_text

        if kind == "round" and data.get("summary") is not None:
            summary = data["summary"]
            desc = (f"trial {data.get('number')}: {self.what}, round {data['rounds']}: "
                    f"{ratio_text(summary.median, summary.ci_low, summary.ci_high)} the incumbent")
        else:
            desc = {"trial_start": f"trial {data.get('number')}: {what}", "trial_done": f"trial {data.get('number')} done",
                    "waiting": "waiting for trials running elsewhere",
                    "run_on": "running the tuned config past its measured steps"}.get(kind, f"trial {data.get('number')}: {self.what}")
        best = (f"best {figure_text(self.best.value, self.best.ci_low, self.best.ci_high).partition(' ')[0]} {self.best.unit}"
                if self.best else "")
        self.progress.update(self.task, description=desc, best=best, completed=min(self.budget_s, time.monotonic() - self.start))

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)
