"""The `compare` flow: two configs of one workload or script, measured in alternation as two trial
processes (`torchpace.trial.pair.run_pair`), and the comparison's figures (pure `build_comparison`).

The figures, one definition for the terminal, `--json` and the report:

- the ratio is B / A: the median of the per-round ratios, with its distribution-free 95% CI
  (`measure.stats.summarize`); above 1 B is faster;
- each arm's figure is the median of its own turns (samples/s, or steps/s when the samples per step
  of a script are unknown; under the latency objective the median of its turns' batch-1 p50s, in seconds),
  with its CI;
- the verdict: `faster` when the whole CI is above 1, `slower` when it is below, else `no difference`
  (the comparison cannot tell them apart within its CI); `too few rounds` when the rounds hold no 95% CI
  (fewer than `MIN_WINDOWS_FOR_CI`: the order statistics of 2 rounds bound the median 1 time in 2, and
  every text names the CI by the coverage it has);
- the other load is other processes' CPU use during each arm's turns; when material it is said next
  to the verdict, naming the compared knobs whose gains depend on free cores.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from torchpace.config import RunConfig
from torchpace.errors import UsageError
from torchpace.host import HostFacts
from torchpace.knobs import REGISTRY, workload_defaults
from torchpace.launch.command import parse_python_command
from torchpace.measure.comparison import RESULT_KIND, RESULT_SCHEMA_VERSION, Comparison, ComparisonArm
from torchpace.measure.contention import decision_note
from torchpace.measure.render import config_label, settings_text
from torchpace.measure.result import LATENCY, SAMPLES_PER_S, SECONDS, STEPS_PER_S, THROUGHPUT
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI, Summary, ratio_text, summarize, summary_ratio_text
from torchpace.protocol import INVALID, TrialSpec, compile_allowance_s
from torchpace.script.knobs import check_script_config
from torchpace.trial.pair import run_pair
from torchpace.trial.schedule import SEQUENTIAL, PairOptions, PairResult, sequential_reason
from torchpace.trial.script import script_trial_spec
from torchpace.tune.objective import check_objective, objective_value
from torchpace.workload import DEFAULT_WORKLOAD, load_workload

_START_MARGIN_S = 120.0  # start-up, guard steps and compile beyond the measured time
_WARMUP_SHARE = 0.4  # each arm's warm-up may use this share of --max-time (the bench's own rule)
_SWITCHING_SPREAD = 3.0  # an arm whose fastest turn is this many times its slowest switched speed between turns


@dataclass(frozen=True)
class CompareOptions:
    """What `torchpace compare` takes (times in seconds)."""

    max_time_s: float = 30.0  # the rounds: both arms' turns together
    sequential: bool = False  # separate runs A B A B A B instead of turns
    samples_per_step: int | None = None
    device: str | None = None
    objective: str = THROUGHPUT  # or `latency`: an inference workload's batch-1 p50, each turn timing single calls

    def timeout_s(self, max_time_s: float | None = None) -> float:
        """The cap of a comparison in turns whose rounds take `max_time_s` (default --max-time): both warm-ups,
        the rounds, start-up and ending; also one separate run's, of its share of the time."""
        return (self.max_time_s if max_time_s is None else max_time_s) * (1 + 2 * _WARMUP_SHARE) + _START_MARGIN_S


def arm_specs(target: str | None, command: Sequence[str] | None, config_a: RunConfig, config_b: RunConfig,
              options: CompareOptions) -> tuple[TrialSpec, TrialSpec]:
    """The two arms' trial specs: the same workload or script, each with its config."""
    if command:
        return tuple(script_trial_spec(command, config, options.max_time_s, samples_per_step=options.samples_per_step)
                     for config in (config_a, config_b))

    return tuple(TrialSpec(workload=target or DEFAULT_WORKLOAD, config=dict(config.values), max_time_s=options.max_time_s,
                           device=options.device, sys_path=[os.getcwd()], objective=options.objective,
                           compile_allowance_s=compile_allowance_s(config.values))
                 for config in (config_a, config_b))


def compare(target: str | None, command: Sequence[str] | None, config_a: RunConfig, config_b: RunConfig,
            options: CompareOptions, host: HostFacts, show_progress: bool = True) -> Comparison:
    """Compare `config_b` with `config_a` on the workload `target` or the script `command`.

    Raises:
        UsageError: a knob of either config does not apply here (before anything starts).
    """
    label, config_a, config_b = _check_configs(target, command, config_a, config_b, host, options.objective)
    spec_a, spec_b = arm_specs(target, command, config_a, config_b, options)
    pair_options = PairOptions(rounds_s=options.max_time_s)
    compiling_s = max(spec_a.compile_allowance_s, spec_b.compile_allowance_s)  # an arm that compiles may take that longer
    pair_options = replace(pair_options, run_timeout_s=options.timeout_s(pair_options.run_time_s(options.max_time_s)) + compiling_s)
    sequential = "asked for (--sequential)" if options.sequential else sequential_reason(spec_a, spec_b)
    # separate runs: each capped as one of its share of the time would be
    timeout_s = pair_options.separate_runs_timeout_s if sequential else options.timeout_s() + compiling_s
    with round_progress(show_progress, f"compare {label}") as on_round:
        pair = run_pair(spec_a, spec_b, host, timeout_s, pair_options, sequential=sequential, on_round=on_round,
                        figure=lambda bench: objective_value(bench, options.objective)[0])
    for arm in (pair.a, pair.b):
        if arm.status == INVALID:
            raise UsageError(arm.error)
    return build_comparison(pair, label, config_a, config_b, options.objective, script=bool(command))


def _check_configs(target, command, config_a: RunConfig, config_b: RunConfig, host: HostFacts,
                   objective: str = THROUGHPUT) -> tuple[str, RunConfig, RunConfig]:
    """The compared thing's label and the two configs as its runs have them (a workload's own DataLoader
    arguments where a config sets none), after checking that every knob of both configs can run here, and
    that the objective can be measured on it (latency: an inference workload)."""
    if command:
        label = parse_python_command(command).label
        if objective == LATENCY:
            raise UsageError(f"--objective latency needs an inference workload (a Workload with loss=None), and {label} "
                             "is a script, measured by its own steps: compare it with --objective throughput")
        for config in (config_a, config_b):
            check_script_config(config, host, label)
        return label, config_a, config_b
    from torchpace.runtime.prepare import check_config

    workload = load_workload(target)
    check_objective(objective, workload.is_training, workload.name)
    for config in (config_a, config_b):
        check_config(config, host, workload)
    own = workload_defaults(workload)
    return workload.name, config_a.with_defaults(own), config_b.with_defaults(own)


def build_comparison(pair: PairResult, label: str, config_a: RunConfig, config_b: RunConfig,
                     objective: str = THROUGHPUT, script: bool = False) -> Comparison:
    """The comparison's figures (see the module docstring) from a `PairResult` (pure); `script`: the arms ran an
    unmodified script, whose own settings are what a config that sets nothing runs with."""
    summary = pair.summary
    latency = objective == LATENCY
    unit = SECONDS if latency else STEPS_PER_S if any(
        arm.bench and not arm.bench.throughput.samples_known for arm in (pair.a, pair.b)) else SAMPLES_PER_S
    changed = sorted(set(config_a.values.items()) ^ set(config_b.values.items()))
    core_knobs = sorted({name for name, _ in changed if REGISTRY[name].shares_cores})
    loads = [load for load in (pair.other_load_a, pair.other_load_b) if load is not None]
    note = decision_note(max(loads), pair.usable_cores or 1, core_knobs) if loads else None
    if note and (switched := _switching_arms(pair)):
        note += f"; {switched}"
    verdict = _verdict(pair, summary)
    return Comparison(
        kind=RESULT_KIND, schema_version=RESULT_SCHEMA_VERSION, target=label,
        mode=pair.mode, mode_reason=pair.mode_reason, unit=unit, stopped_by=pair.stopped_by,
        a=_arm(pair.a, config_a, pair.a_rates, pair.other_load_a, latency, script),
        b=_arm(pair.b, config_b, pair.b_rates, pair.other_load_b, latency, script),
        ratio=summary.median if summary else None, ratio_ci_low=summary.ci_low if summary else None,
        ratio_ci_high=summary.ci_high if summary else None, ratio_ci_coverage=summary.ci_coverage if summary else None,
        rounds=summary.n if summary else 0, ratios=tuple(pair.ratios),
        verdict=verdict, summary=_sentence(verdict, summary, pair), other_load_note=note,
        usable_cores=pair.usable_cores, wall_time_s=pair.wall_time_s, objective=objective,
    )


def _switching_arms(pair: PairResult) -> str | None:
    """Said when an arm's turns ran at speeds `_SWITCHING_SPREAD` or more apart: under other processes' load a
    step with two or more OpenMP threads switches between its normal speed and one many times slower (a
    thread waits at a barrier for one that lost its core), and keeps each for seconds, so its turns fall
    in two groups and the ratio's CI stays wide however the turns are paired."""
    said = []
    for name, rates in (("A", pair.a_rates), ("B", pair.b_rates)):
        measured = [r for r in rates if r > 0]
        if len(measured) >= 2 and max(measured) >= _SWITCHING_SPREAD * min(measured):
            said.append(f"arm {name}'s turns ran at {min(measured):,.0f} to {max(measured):,.0f} "
                        f"({max(measured) / min(measured):.0f}x apart)")
    if not said:
        return None
    whose = "its" if len(said) == 1 else "their"
    return (f"{' and '.join(said)}: {whose} speed switched between turns, as a step with two or more intra-op "
            "threads does when other processes take their cores, so the ratio stays uncertain; with one intra-op "
            "thread (`--set threads.intra_op=1` in both arms) such steps keep their speed")


def _verdict(pair: PairResult, summary: Summary | None) -> str:
    if not pair.ok or summary is None:
        return "failed"
    if not summary.full_ci:
        return "too few rounds"
    if summary.ci_low > 1.0:
        return "faster"
    if summary.ci_high < 1.0:
        return "slower"
    return "no difference"


def _sentence(verdict: str, summary: Summary | None, pair: PairResult) -> str:
    """One line: what the comparison concludes, with the ratio and its CI."""
    if verdict == "failed":
        failed = next(name for name, arm in (("B", pair.b), ("A", pair.a)) if not arm.ok) if not (pair.a.ok and pair.b.ok) \
            else "neither"
        return f"no ratio: arm {failed} did not finish a measurement" if failed != "neither" else "no ratio: no round completed"
    ratio, ci = summary_ratio_text(summary)
    if verdict == "too few rounds":
        more = ("a separate run that measured nothing leaves its round out" if pair.mode == SEQUENTIAL
                else "a script's run ends it: more steps or epochs through the script's own arguments give more"
                if pair.stopped_by == "ended" else "a longer --max-time gives more")
        return (f"too few rounds to tell: B is {ratio} A ({ci}; a 95% CI needs {MIN_WINDOWS_FOR_CI} "
                f"rounds, {more})")
    if verdict == "faster":
        return f"B is faster: {ratio} A ({ci})"
    if verdict == "slower":
        return f"B is slower: {ratio} A ({ci})"
    return f"no difference this comparison can tell: B is {ratio} A ({ci}, which contains 1)"


def _arm(result, config: RunConfig, rates: Sequence[float], other_load: float | None,
         latency: bool = False, script: bool = False) -> ComparisonArm:
    """One arm in the comparison: its config (every value it set: a default too replaces a script's own
    argument), what that ran in words, status, and the median of its turns with the CI (`latency`: the turns'
    rates are 1 / p50, shown as the p50s, in seconds)."""
    if latency:
        rates = [1.0 / rate if rate > 0 else 0.0 for rate in rates]
    figure = summarize(list(rates)) if rates else None
    settings = result.bench.script.script_settings if result.bench and result.bench.script else None
    ran = config_label(config.values, script) + (f" ({settings_text(settings)})" if settings and not config.values else "")
    return ComparisonArm(
        config=dict(config.values), label=ran, status=result.status, figure=figure.median if figure else None,
        ci_low=figure.ci_low if figure else None, ci_high=figure.ci_high if figure else None, rounds=len(rates),
        other_load_cores=other_load, error=result.error or None, stderr_tail=result.stderr_tail or None,
        warmup_converged=result.bench.throughput.warmup_converged if result.bench else None, turns=tuple(rates))


@contextlib.contextmanager
def round_progress(enabled: bool, label: str) -> Iterator:
    """A Rich spinner on stderr with the rounds so far and the current ratio (None when disabled or not a tty)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(label, total=None, status="starting both arms, then each warms up alone")
        started = time.perf_counter()

        def on_round(rounds: int, summary: Summary | None) -> None:
            if summary is not None:
                progress.update(task, status=f"round {rounds}: B/A {ratio_text(summary.median, summary.ci_low, summary.ci_high)}"
                                f"  ({time.perf_counter() - started:.0f} s)")

        yield on_round
