"""`torchpace bench --scaling 1,2,...`: the same job measured at several world sizes, and its scaling efficiency.

The number a user reads before buying more GPUs: how much faster the job trains with N ranks than with the
first world size given (N0, usually 1). Each other world size is compared with N0 in separate runs taken in
turns, N0 N N0 N ... (`torchpace.trial.pair.run_pair`: a job of several ranks runs as one, so the arms are
separate runs, three to a round, as every comparison of several ranks is), which cancels the host's drift as
a paired comparison does; then

    speedup(N)    = the median over rounds of samples/s at N / samples/s at N0, with its 95% CI
    efficiency(N) = speedup(N) * N0 / N   (1.0: linear scaling; its CI is the speedup's, scaled alike)

A script's world size is changed through its launcher's own option (`torchrun --nproc-per-node`, `accelerate
launch --num_processes`: `Launcher.with_ranks`), every other option as the user gave it; a Workload's through
`nproc_per_node` (with `distributed.strategy = ddp` where its config sets no strategy). A script that starts
its own ranks has its world size in its code: it is refused, naming the launcher to use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from rich.table import Table

from torchpace.config import RunConfig
from torchpace.errors import UsageError
from torchpace.host import HostFacts
from torchpace.knobs.distributed import usable_devices
from torchpace.launch.command import parse_python_command
from torchpace.measure.comparison import Comparison
from torchpace.measure.stats import summarize
from torchpace.protocol import INVALID, TrialSpec, compile_allowance_s
from torchpace.records import spec, to_json
from torchpace.script.knobs import check_script_config
from torchpace.compare.run import CompareOptions, build_comparison, round_progress
from torchpace.trial.pair import run_pair
from torchpace.trial.schedule import PairOptions
from torchpace.trial.script import script_trial_spec
from torchpace.workload import DEFAULT_WORKLOAD, load_workload

SCALING_KIND = "torchpace.scaling"
SCALING_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ScalingPoint:
    """One world size of the job, measured beside the reference one.

    Attributes:
        ranks: processes of the job (on this node).
        samples_per_s: the median of its separate runs' figures (samples/s, or steps/s when unknown).
        speedup: its figure over the reference's: the median of the rounds' ratios (1.0 for the reference).
        speedup_ci_low: the 95% CI of `speedup` (None under 6 rounds, or for the reference).
        speedup_ci_high: see `speedup_ci_low`.
        efficiency: `speedup` times reference ranks / `ranks` (1.0: linear scaling).
        efficiency_ci_low: the CI of `speedup`, scaled alike.
        efficiency_ci_high: see `efficiency_ci_low`.
        rounds: the rounds the ratio was taken over (0 for the reference).
        error: why this world size has no figure (its runs failed), else None.
    """

    ranks: int = field(metadata=spec(minimum=1))
    samples_per_s: float | None = None
    speedup: float | None = None
    speedup_ci_low: float | None = None
    speedup_ci_high: float | None = None
    efficiency: float | None = None
    efficiency_ci_low: float | None = None
    efficiency_ci_high: float | None = None
    rounds: int = 0
    error: str | None = None


@dataclass(frozen=True)
class ScalingResult:
    """`bench --scaling`: the job at each world size, against the first (`reference_ranks`).

    Attributes:
        target: the workload, or the script's command as the user gave it.
        unit: `samples/s`, or `steps/s` for a script whose samples per step are unknown.
        reference_ranks: the world size every other is compared with.
        points: one per world size, the reference's first.
        comparisons: the comparison of each other world size with the reference, as `compare` reports one.
    """

    kind: str = field(default=SCALING_KIND, metadata=spec(const=SCALING_KIND))
    schema_version: int = field(default=SCALING_SCHEMA_VERSION, metadata=spec(const=SCALING_SCHEMA_VERSION))
    target: str = ""
    unit: str = "samples/s"
    reference_ranks: int = 1
    points: tuple[ScalingPoint, ...] = ()
    comparisons: tuple[Comparison, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def parse_scaling(text: str, host: HostFacts) -> tuple[int, ...]:
    """The world sizes of `--scaling` (`1,2,4`): whole numbers of 1 or more, at least two different ones, none
    above what this host has a device for (its GPUs, else its usable cores); in the order given, the first the
    reference.

    Raises:
        UsageError: naming what was wrong and what is valid.
    """
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not all(w.isdigit() and int(w) >= 1 for w in words):
        raise UsageError(f"--scaling {text!r}: give world sizes as whole numbers of 1 or more, separated by commas "
                         "(e.g. --scaling 1,2,4)")
    sizes = tuple(dict.fromkeys(int(w) for w in words))
    if len(sizes) < 2:
        raise UsageError(f"--scaling {text!r} names one world size: give the reference and at least one more "
                         "(e.g. --scaling 1,2)")
    devices = usable_devices(host)
    kind = "GPU(s)" if host.cuda_available and host.gpus else "usable CPU core(s)"
    over = [n for n in sizes if n > devices]
    if over:
        raise UsageError(f"--scaling {text!r}: {over[0]} ranks is more than this host's {devices} {kind} "
                         f"(valid: 1 to {devices})")
    return sizes


def scaled_command(command: Sequence[str], ranks: int) -> list[str]:
    """The user's launcher command starting `ranks` processes on this node, every other word as given.

    Raises:
        UsageError: the command has no launcher whose ranks torchpace can set.
    """
    program = parse_python_command(command)
    launcher = program.launcher
    if launcher is None:
        raise UsageError(f"--scaling changes the world size through a launcher's option, and `{program.label}` runs "
                         "without one (a script that starts its own ranks has their number in its code): run it "
                         "under a launcher (`torchrun --nproc-per-node N train.py`, `accelerate launch --num_processes "
                         "N train.py`), or give a Workload")
    tail = launcher.argv_tail()
    head = list(command)[: len(command) - len(tail)]
    return [*head, *launcher.with_ranks(ranks).argv_tail()]


def _workload_config(config: RunConfig, ranks: int) -> RunConfig:
    values = {**config.values, "nproc_per_node": ranks}
    if ranks > 1 and values.get("distributed.strategy", "none") == "none":
        values["distributed.strategy"] = "ddp"
    if ranks == 1 and values.get("distributed.strategy") == "ddp" and "distributed.strategy" not in config.values:
        values.pop("distributed.strategy")
    return RunConfig(values)


def measure_scaling(target: str | None, command: Sequence[str] | None, config: RunConfig, sizes: Sequence[int],
                    options: CompareOptions, host: HostFacts, show_progress: bool = True) -> ScalingResult:
    """Measure the job at each of `sizes` against the first (see the module docstring).

    Raises:
        UsageError: a world size or the config cannot run here (before anything starts).
    """
    if "nproc_per_node" in config.values:
        raise UsageError("--scaling sets nproc_per_node itself for each world size: leave it out of the config")
    specs = {n: _spec(target, command, config, n, options, host) for n in sizes}
    reference = sizes[0]
    pair_options = PairOptions(rounds_s=options.max_time_s)
    compiling_s = max(s.compile_allowance_s for s in specs.values())
    pair_options = replace(pair_options, run_timeout_s=options.timeout_s(pair_options.run_time_s(options.max_time_s))
                           + compiling_s)
    label = _label(target, command)
    comparisons, points, runs = [], [], {reference: []}
    for ranks in sizes[1:]:
        reason = f"scaling: {reference} and {ranks} ranks are each one job, measured in separate runs"
        with round_progress(show_progress, f"scaling {label}: {reference} vs {ranks} ranks") as on_round:
            pair = run_pair(specs[reference], specs[ranks], host, pair_options.separate_runs_timeout_s, pair_options,
                            sequential=reason, on_round=on_round)
        for arm in (pair.a, pair.b):
            if arm.status == INVALID:
                raise UsageError(arm.error)
        comparison = build_comparison(pair, label, _arm_config(config, reference, command),
                                      _arm_config(config, ranks, command), script=bool(command))
        comparisons.append(comparison)
        runs[reference] += list(pair.a_rates)
        points.append(_point(ranks, reference, comparison))
    base = summarize(runs[reference]).median if runs[reference] else None
    unit = comparisons[0].unit if comparisons else "samples/s"
    return ScalingResult(target=label, unit=unit, reference_ranks=reference,
                         points=(ScalingPoint(reference, base, 1.0, efficiency=1.0), *points), comparisons=tuple(comparisons))


def _point(ranks: int, reference: int, comparison: Comparison) -> ScalingPoint:
    scale = reference / ranks
    if comparison.ratio is None:
        failed = comparison.b if comparison.b.status != "ok" else comparison.a
        return ScalingPoint(ranks, error=failed.error or comparison.summary)
    low, high = comparison.ratio_ci_low, comparison.ratio_ci_high
    return ScalingPoint(ranks, comparison.b.figure, comparison.ratio, low, high, comparison.ratio * scale,
                        low * scale if low is not None else None, high * scale if high is not None else None,
                        comparison.rounds)


def _spec(target: str | None, command: Sequence[str] | None, config: RunConfig, ranks: int, options: CompareOptions,
          host: HostFacts) -> TrialSpec:
    if command:
        scaled = scaled_command(command, ranks)
        check_script_config(config, host, parse_python_command(scaled).label)
        return script_trial_spec(scaled, config, options.max_time_s, samples_per_step=options.samples_per_step)
    from torchpace.runtime.prepare import check_config

    arm = _workload_config(config, ranks)
    check_config(arm, host, load_workload(target or DEFAULT_WORKLOAD))
    return TrialSpec(workload=target or DEFAULT_WORKLOAD, config=dict(arm.values), max_time_s=options.max_time_s,
                     device=options.device, sys_path=[os.getcwd()], compile_allowance_s=compile_allowance_s(arm.values))


def _arm_config(config: RunConfig, ranks: int, command: Sequence[str] | None) -> RunConfig:
    """The config an arm ran: a script's as given (its launcher sets the ranks), a Workload's with its ranks."""
    return config if command else _workload_config(config, ranks)


def _label(target: str | None, command: Sequence[str] | None) -> str:
    if command:
        return parse_python_command(command).label
    return target or DEFAULT_WORKLOAD


def render_scaling(console, result: ScalingResult) -> None:
    """The terminal's table: each world size's figure, speedup and efficiency with their CIs."""
    table = Table(title=f"torchpace bench --scaling: {result.target} (each world size against {result.reference_ranks})")
    for column in ("ranks", result.unit, "speedup [95% CI]", "efficiency [95% CI]", "rounds"):
        table.add_column(column, justify="right" if column != "ranks" else "left")
    for point in result.points:
        if point.error:
            table.add_row(str(point.ranks), "-", f"failed: {point.error}", "-", "-")
            continue
        figure = f"{point.samples_per_s:,.1f}" if point.samples_per_s is not None else "-"
        if point.ranks == result.reference_ranks:
            table.add_row(str(point.ranks), figure, "1.00x (reference)", "1.00", "-")
            continue
        table.add_row(str(point.ranks), figure, _with_ci(point.speedup, point.speedup_ci_low, point.speedup_ci_high, "x"),
                      _with_ci(point.efficiency, point.efficiency_ci_low, point.efficiency_ci_high, ""), str(point.rounds))
    console.print(table)
    console.print("efficiency = speedup x reference ranks / ranks: 1.00 is linear scaling. Each world size was run "
                  "in turns with the reference, separate runs three to a round (a job of several ranks is measured as one).")


def _with_ci(value: float | None, low: float | None, high: float | None, suffix: str) -> str:
    if value is None:
        return "-"
    ci = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else " (too few rounds for a 95% CI)"
    return f"{value:.2f}{suffix}{ci}"


__all__ = ["ScalingPoint", "ScalingResult", "measure_scaling", "parse_scaling", "render_scaling", "scaled_command"]
