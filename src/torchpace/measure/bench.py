"""`run_bench`: measure a workload's real step under a config (docs/design.md#measurement).

The timed step is the whole thing a training loop does: next batch from the DataLoader, host-to-device
copy, forward, loss, backward, optimizer. Then the same step is timed on one batch pre-staged on the
device (`compute_only_samples_per_s`), the ceiling the input pipeline could reach;
`input_bound_frac = 1 - samples_per_s / compute_only_samples_per_s` (0 when not input-bound).

Inference workloads (`loss=None`) also get the latency of ONE request: per-call p50 / p90 / p99 at
batch 1 with the 95% CI of p50 (`torchpace.measure.latency`), on one sample pre-staged on the
device; `samples_per_s` is their throughput at the loader's batch size. They may also be checked
against their fp32 eager reference (`accuracy=`, see `torchpace.inference.accuracy`).
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import torch

from torchpace.config import RunConfig, resolve_config
from torchpace.errors import TorchpaceError, UserCodeError
from torchpace.host import HostFacts, probe_host
from torchpace.measure.contention import measure_other_load
from torchpace.measure.gate import Gate
from torchpace.measure.memory import device_sync, read_peak_memory, reset_peak_memory
from torchpace.measure.result import (RESULT_KIND, RESULT_SCHEMA_VERSION, AccuracyReport, BenchResult,  # noqa: F401
                                      LatencyFigures, ScriptInfo, StepShape, ThroughputFigures)
from torchpace.measure.timing import Clock, Throughput, TimingOptions, measure_throughput
from torchpace.records import from_json
from torchpace.runtime import Prepared, prepare
from torchpace.runtime.batch import batch_len
from torchpace.runtime.loader import LoaderCycle
from torchpace.workload import Workload

if TYPE_CHECKING:
    from torchpace.measure.latency import Latency

WARMUP_SHARE = 0.4  # warm-up may use up to this share of the time cap (compile can take ~20 s)
_MAIN_SHARE = 0.8  # the real-step measurement ends by this share; compute-only gets the rest


@dataclass(frozen=True)
class _Phases:
    """Shares of the time cap by which each phase ends (each phase may overrun a little: see timing)."""

    warmup_end: float
    real_end: float
    compute_end: float


_TRAINING_PHASES = _Phases(WARMUP_SHARE, _MAIN_SHARE, 1.0)
# inference: throughput (real step) by half the cap, compute-only by 70%, batch-1 latency the rest
_INFERENCE_PHASES = _Phases(0.25, 0.5, 0.7)


@dataclass(frozen=True)
class BenchOptions:
    """How long and how precisely to measure."""

    max_time_s: float = 60.0
    target_ci_rel: float = 0.02
    compute_only: bool = True
    window_s: float | None = None  # default: max_time_s / 40, within [0.1, 1.0] s
    latency: bool | None = None  # batch-1 latency percentiles; None: for inference workloads only

    def timing(self) -> TimingOptions:
        window = self.window_s or min(1.0, max(0.1, self.max_time_s / 40))
        return TimingOptions(window_s=window, target_ci_rel=self.target_ci_rel)


def _measure_real_step(run: Prepared, clock: Clock, opts: BenchOptions, start: float, losses: list, on_window,
                       phases: _Phases = _TRAINING_PHASES, gate: Gate | None = None) -> Throughput:
    cycle = LoaderCycle(run.loader)

    def step() -> int:
        batch = cycle.next()
        out = run.step(batch)
        if run.workload.is_training:
            losses.append(out)
        return batch_len(batch) * run.world_size  # every rank steps on an equal shard

    try:
        return measure_throughput(step, clock, device_sync(run.device), opts.timing(),
                                  start + phases.warmup_end * opts.max_time_s, start + phases.real_end * opts.max_time_s, on_window,
                                  gate)
    finally:
        cycle.close()


def _measure_compute_only(run: Prepared, clock: Clock, opts: BenchOptions, start: float, on_window,
                          phases: _Phases = _TRAINING_PHASES) -> Throughput:
    first = LoaderCycle(run.loader)
    try:
        staged = run.to_device(first.next())
    finally:
        first.close()
    samples = batch_len(staged) * run.world_size

    def step() -> int:
        run.step_on_device(staged)
        return samples

    now = clock()
    end = phases.compute_end * opts.max_time_s
    remaining = max(end - phases.real_end * opts.max_time_s, start + end - now)
    return measure_throughput(step, clock, device_sync(run.device), opts.timing(), now + remaining / 2, now + remaining, on_window)


def _measure_batch1_latency(run: Prepared, clock: Clock, opts: BenchOptions, start: float, phases: _Phases) -> Latency:
    """Per-call latency of one request: one sample pre-staged on the device, synced after each call."""
    from torchpace.measure.latency import LatencyOptions, measure_latency

    loader = torch.utils.data.DataLoader(run.loader.dataset, batch_size=1, shuffle=False, collate_fn=run.workload.collate_fn)
    staged = run.to_device(next(iter(loader)))
    now = clock()
    remaining = max((1 - phases.compute_end) * opts.max_time_s, start + opts.max_time_s - now)
    return measure_latency(lambda: run.step_on_device(staged), clock, device_sync(run.device),
                           LatencyOptions(target_ci_rel=opts.target_ci_rel), now + remaining / 2, now + remaining)


def run_bench(
    workload: Workload,
    config: RunConfig | dict | str | None = None,
    options: BenchOptions = BenchOptions(),
    *,
    host: HostFacts | None = None,
    device: str | None = None,
    clock: Clock = time.perf_counter,
    on_window: Callable | None = None,
    accuracy: Callable[[Prepared], dict[str, Any]] | None = None,
    own_root_pid: int | None = None,
    gate: Gate | None = None,
) -> BenchResult:
    """Measure `workload` under `config`. See the module docstring for what is timed.

    Args:
        accuracy: called with the prepared run before anything is timed (e.g. an
            `torchpace.inference.accuracy.AccuracyGuard`); its dict is the result's `accuracy`.
        own_root_pid: the root of torchpace's own process tree, whose CPU use is not "other load"
            (default this process; a trial process passes the tuner that started it).
        gate: take turns with another trial in a paired comparison (`torchpace.measure.gate`); the
            real step is then measured one window per turn, and `clock` must be `gate.clock`.

    Raises:
        UsageError: the config does not apply here.
        UserCodeError: the workload's code raised while stepping.
        AccuracyRejected: `accuracy` rejected the candidate (nothing was timed).
    """
    config = resolve_config(config)
    host = host or probe_host()
    start = clock()
    losses: list[torch.Tensor] = []
    with prepare(workload, config, device=device, host=host) as run:
        if run.world_size > 1:  # every rank reads the same clock: the same windows, the same decisions
            from torchpace.runtime.distributed import CollectiveClock

            clock = CollectiveClock(clock, run.dist)
            start = clock()
        reset_peak_memory(run.device)
        try:
            with measure_other_load(own_root_pid) as load:
                checked = accuracy(run) if accuracy is not None else None
                real, compute, latency = _measure_all(run, clock, options, start, losses, on_window, gate)
        except TorchpaceError:
            raise
        except Exception as err:  # the user's model/loss/data raised: report it as theirs
            raise UserCodeError("running the workload's training step", "".join(traceback.format_exception(err))) from err
        peak_bytes, peak_kind = read_peak_memory(run.device)
        if run.dist is not None:
            peak_bytes = int(run.dist.max(peak_bytes))
        result = _build_result(workload, config, run, real, compute, losses, peak_bytes, peak_kind, clock() - start, host)
        result = replace(result, other_load_cores=load.cores)
        return replace(result, **_inference_fields(run, latency, checked)) if not workload.is_training else result


def _measure_all(run: Prepared, clock: Clock, opts: BenchOptions, start: float, losses: list, on_window,
                 gate: Gate | None = None):
    """(real step, compute-only or None, batch-1 latency or None), in that order within the time cap."""
    wants_latency = opts.latency if opts.latency is not None else not run.workload.is_training
    phases = _INFERENCE_PHASES if wants_latency else _TRAINING_PHASES
    real = _measure_real_step(run, clock, opts, start, losses, on_window, phases, gate)
    compute = _measure_compute_only(run, clock, opts, start, on_window, phases) if opts.compute_only else None
    latency = _measure_batch1_latency(run, clock, opts, start, phases) if wants_latency else None
    return real, compute, latency


def _inference_fields(run: Prepared, latency: Latency | None, accuracy: AccuracyReport | None) -> dict[str, Any]:
    """The inference-only parts of a BenchResult (latency percentiles, model size, accuracy)."""
    from torchpace.inference.quantize import model_size_bytes

    fields: dict[str, Any] = {"model_size_bytes": model_size_bytes(run.model), "accuracy": accuracy}
    if latency is not None:
        s = latency.summary
        fields["latency"] = LatencyFigures(batch_size=1, p50_s=s.p50_s, p90_s=s.p90_s, p99_s=s.p99_s,
                                           p50_ci_low_s=s.p50_ci_low_s, p50_ci_high_s=s.p50_ci_high_s,
                                           ci_rel_halfwidth=s.ci_rel_halfwidth, calls=s.n, warmup_s=latency.warmup_s,
                                           stopped_by=latency.stopped_by)
    return fields


def throughput_figures(real: Throughput, samples_known: bool = True) -> ThroughputFigures:
    """The figures of a measured phase (the one definition, for both bench modes).

    The meter measured samples/s when `samples_known`, else steps/s; steps/s is always reported, as
    the median over windows of steps per second with its own CI.
    """
    from torchpace.measure.stats import summarize

    summary = real.summary
    step_rates = tuple(w.steps / w.elapsed_s for w in real.windows if w.elapsed_s > 0)
    steps = summarize(list(step_rates))
    known = samples_known or None  # None blanks every samples/s figure
    return ThroughputFigures(
        samples_per_s=known and summary.median, samples_per_s_ci_low=known and summary.ci_low,
        samples_per_s_ci_high=known and summary.ci_high, samples_per_s_iqr=known and summary.iqr,
        window_samples_per_s=tuple(w.samples_per_s for w in real.windows) if samples_known else (),
        ci_rel_halfwidth=summary.ci_rel_halfwidth, noise_warning=summary.noisy, step_time_s=real.step_time_s,
        windows=summary.n, measured_steps=real.measured_steps, warmup_s=real.warmup_s, warmup_steps=real.warmup_steps,
        warmup_converged=real.warmup_converged, stopped_by=real.stopped_by, steps_per_s=steps.median,
        steps_per_s_ci_low=steps.ci_low, steps_per_s_ci_high=steps.ci_high, window_steps_per_s=step_rates)


def _build_result(workload, config, run, real: Throughput, compute: Throughput | None, losses, peak_bytes, peak_kind, wall_s, host) -> BenchResult:
    compute_sps = compute.summary.median if compute else None
    input_bound = max(0.0, 1.0 - real.summary.median / compute_sps) if compute_sps else None
    loss_values = tuple(torch.stack(losses).tolist()) if losses else ()
    batch_size = run.loader.batch_size or workload.batch_size
    return BenchResult(
        workload=workload.name,
        config=config.non_default(),
        device=str(run.device),
        step=StepShape(batch_size=batch_size, grad_accumulation=run.grad_accumulation, world_size=run.world_size,
                       global_batch_size=batch_size * run.world_size),
        throughput=throughput_figures(real),
        compute_only_samples_per_s=compute_sps,
        input_bound_frac=input_bound,
        peak_memory_bytes=peak_bytes,
        peak_memory_kind=peak_kind,
        loss_values=loss_values,
        wall_time_s=wall_s,
        host=host.summary(),
    )


def build_script_bench(real: Throughput, *, samples_known: bool, device, losses: list[float], wall_s: float,
                       measured_wait_s: float | None, batch_size: int | None, backwards_per_step: int,
                       script: dict[str, Any], other_load_cores: float | None = None) -> BenchResult:
    """The BenchResult of a script measured from inside its process (`torchpace.script.hook`).

    There is no compute-only ceiling for a script (its batches cannot be replayed), so
    `input_bound_frac` is the measured share of window time spent inside the DataLoader iterator's
    `__next__` (None when the script read no DataLoader), and `compute_only_samples_per_s` is None. `config` is left empty: the parent, which
    planned the run, fills it in. `other_load_cores` is read by the caller over the measurement, as
    `torchpace.measure.contention` defines it.
    """
    device = device if device is not None else torch.device("cpu")
    elapsed_s = sum(w.elapsed_s for w in real.windows)
    peak_bytes, peak_kind = read_peak_memory(device)
    info = from_json(ScriptInfo, script)
    return BenchResult(
        workload=" ".join(info.command) or "script", config={}, device=str(device),
        step=StepShape(batch_size=batch_size, grad_accumulation=max(1, backwards_per_step), world_size=1,
                       global_batch_size=batch_size),
        throughput=throughput_figures(real, samples_known), compute_only_samples_per_s=None,
        input_bound_frac=min(1.0, measured_wait_s / elapsed_s) if elapsed_s > 0 and measured_wait_s is not None else None,
        peak_memory_bytes=peak_bytes, peak_memory_kind=peak_kind, loss_values=tuple(losses), wall_time_s=wall_s,
        host=probe_host().summary(), script=info, other_load_cores=other_load_cores)
