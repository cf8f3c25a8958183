"""`run_bench`: measure a workload's real step under a config (docs/design.md#measurement).

The timed step is the whole thing a training loop does: next batch from the DataLoader, host-to-device
copy, forward, loss, backward, optimizer. Then the same step is timed on one batch pre-staged on the
device (`compute_only_samples_per_s`), the ceiling the input pipeline could reach;
`input_bound_frac = 1 - samples_per_s / compute_only_samples_per_s` (0 when not input-bound).

Inference workloads (`loss=None`) also get the latency of ONE request: per-call p50 / p90 / p99 at
batch 1 with the 95% CI of p50 (`torchpace.measure.latency`), on one sample pre-staged on the
device; `samples_per_s` is their throughput at the loader's batch size. They may also be checked
against their fp32 eager reference (`accuracy=`, see `torchpace.inference.accuracy`).

In a paired comparison (`gate=`) the real step takes turns with the other arm, window by window; what is
measured after its windows (batch-1 latency) is measured alone while the other arm waits. Under the latency
objective (`BenchOptions.turns`) the order turns round: the batch-1 calls take the turns, since latency is
what decides, and the real step's throughput is measured after them, alone.

A trial process (`torchpace.trial.__main__`) runs it, and so does `torchpace bench` in its own process
when no process-level knob needs a new one; the figures are `torchpace.measure.bench`'s.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from torchpace.config import RunConfig, resolve_config
from torchpace.errors import TorchpaceError, UserCodeError
from torchpace.host import HostFacts, probe_host
from torchpace.measure.bench import WARMUP_SHARE, BenchOptions, latency_figures, throughput_figures
from torchpace.measure.contention import measure_other_load
from torchpace.measure.gate import Gate
from torchpace.measure.latency import Latency, LatencyOptions, measure_latency
from torchpace.measure.memory import device_sync, read_peak_memory, reset_peak_memory
from torchpace.measure.result import LATENCY, AccuracyReport, BenchResult, StepShape
from torchpace.measure.timing import Clock, Throughput, measure_throughput
from torchpace.runtime import Prepared, prepare
from torchpace.engine.batch import batch_len
from torchpace.engine.loader import LoaderCycle
from torchpace.workload import Workload

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
# a comparison's arm whose turns time batch-1 calls: after them, alone, the real step (and compute-only), by
# these shares of the cap counted from the end of one untimed step at the loader's batch (a compiled model compiles
# again for that shape: counted in, it left one window of 80 samples/s where the model runs 3,000)
_AFTER_LATENCY_TURNS = _Phases(0.25, 0.5, 0.6)


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
        return measure_throughput(step, clock, device_sync(run.device), opts.timing(phases.warmup_end),
                                  start + phases.warmup_end * opts.max_time_s, start + phases.real_end * opts.max_time_s, on_window,
                                  gate)
    finally:
        cycle.close()


def _staged_batch(run: Prepared):
    """The loader's first batch, on the device."""
    first = LoaderCycle(run.loader)
    try:
        return run.to_device(first.next())
    finally:
        first.close()


def _measure_compute_only(run: Prepared, clock: Clock, opts: BenchOptions, start: float, on_window,
                          phases: _Phases = _TRAINING_PHASES) -> Throughput:
    staged = _staged_batch(run)
    samples = batch_len(staged) * run.world_size

    def step() -> int:
        run.step_on_device(staged)
        return samples

    now = clock()
    end = phases.compute_end * opts.max_time_s
    remaining = max(end - phases.real_end * opts.max_time_s, start + end - now)
    return measure_throughput(step, clock, device_sync(run.device), opts.timing(), now + remaining / 2, now + remaining, on_window)


def _measure_batch1_latency(run: Prepared, clock: Clock, opts: BenchOptions, start: float, phases: _Phases,
                            gate: Gate | None = None) -> Latency:
    """Per-call latency of one request: one sample pre-staged on the device, synced after each call. With a
    `gate`, in turns: the warm-up may take a throughput meter's share of the cap, and the parent ends the turns."""
    loader = torch.utils.data.DataLoader(run.loader.dataset, batch_size=1, shuffle=False, collate_fn=run.workload.collate_fn)
    staged = run.to_device(next(iter(loader)))
    now = clock()
    remaining = max((1 - phases.compute_end) * opts.max_time_s, start + opts.max_time_s - now)
    warmup_deadline = now + (WARMUP_SHARE * opts.max_time_s if gate is not None else remaining / 2)
    return measure_latency(lambda: run.step_on_device(staged), clock, device_sync(run.device),
                           LatencyOptions(target_ci_rel=opts.target_ci_rel), warmup_deadline, now + remaining, gate)


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
    on_report: Callable[[BenchResult], None] | None = None,
) -> BenchResult:
    """Measure `workload` under `config`. See the module docstring for what is timed.

    Args:
        accuracy: called with the prepared run before anything is timed (e.g. an
            `torchpace.inference.accuracy.AccuracyGuard`); its dict is the result's `accuracy`.
        own_root_pid: the root of torchpace's own process tree, whose CPU use is not "other load"
            (default this process; a trial process passes the tuner that started it).
        gate: take turns with another trial in a paired comparison (`torchpace.measure.gate`); the
            real step is then measured one window per turn (under `options.turns == "latency"`, an inference
            workload's batch-1 calls are, and the real step after the turns), and `clock` must be `gate.clock`.
        on_report: with a `gate`, this process can be kept for the next comparison: at each report the
            parent asks for, it gets the `BenchResult` of the windows since the previous one (a training
            workload's only: what measures after its windows, batch-1 latency, is measured once, at the end).

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
            from torchpace.engine.distributed import CollectiveClock

            clock = CollectiveClock(clock, run.dist)
            start = clock()
        reset_peak_memory(run.device)

        def report(real: Throughput) -> None:
            peak_bytes, peak_kind = read_peak_memory(run.device)
            on_report(_build_result(workload, run, real, None, losses, peak_bytes, peak_kind, clock() - start, host))
            losses.clear()  # the next report's losses are its own windows'

        try:
            with measure_other_load(own_root_pid) as load:
                checked = accuracy(run) if accuracy is not None else None
                real, compute, latency = _measure_all(run, clock, options, start, losses, on_window, gate,
                                                      report if on_report is not None else None)
        except TorchpaceError:
            raise
        except Exception as err:  # the user's model/loss/data raised: report it as theirs
            raise UserCodeError("running the workload's training step", "".join(traceback.format_exception(err))) from err
        peak_bytes, peak_kind = read_peak_memory(run.device)
        if run.dist is not None:
            peak_bytes = int(run.dist.max(peak_bytes))
        result = _build_result(workload, run, real, compute, losses, peak_bytes, peak_kind, clock() - start, host)
        result = replace(result, other_load_cores=load.cores)
        return replace(result, **_inference_fields(run, latency, checked)) if not workload.is_training else result


def _measure_all(run: Prepared, clock: Clock, opts: BenchOptions, start: float, losses: list, on_window,
                 gate: Gate | None = None, report: Callable[[Throughput], None] | None = None):
    """(real step, compute-only or None, batch-1 latency or None), in that order within the time cap."""
    wants_latency = opts.latency if opts.latency is not None else not run.workload.is_training
    phases = _INFERENCE_PHASES if wants_latency else _TRAINING_PHASES
    if gate is not None and wants_latency and opts.turns == LATENCY:  # the turns time batch-1 calls, and the
        gate.alone_after, gate.reporter = True, None  # real step is measured after them while the other arm waits
        latency = _measure_batch1_latency(run, clock, opts, start, phases, gate)
        run.step_on_device(_staged_batch(run))  # untimed: a model compiled for batch 1 compiles for this shape
        after = clock()
        real = _measure_real_step(run, clock, opts, after, losses, on_window, _AFTER_LATENCY_TURNS)
        compute = _measure_compute_only(run, clock, opts, after, on_window, _AFTER_LATENCY_TURNS) if opts.compute_only else None
        return real, compute, latency
    if gate is not None:  # what is measured after the windows is measured while the other arm waits
        gate.alone_after = wants_latency or opts.compute_only
        gate.reporter = None if gate.alone_after else report  # such a process is not kept for another comparison
    real = _measure_real_step(run, clock, opts, start, losses, on_window, phases, gate)
    compute = _measure_compute_only(run, clock, opts, start, on_window, phases) if opts.compute_only else None
    latency = _measure_batch1_latency(run, clock, opts, start, phases) if wants_latency else None
    return real, compute, latency


def _inference_fields(run: Prepared, latency: Latency | None, accuracy: AccuracyReport | None) -> dict[str, Any]:
    """The inference-only parts of a BenchResult (latency percentiles, model size, accuracy)."""
    from torchpace.inference.quantize import model_size_bytes

    fields: dict[str, Any] = {"model_size_bytes": model_size_bytes(run.model), "accuracy": accuracy}
    if latency is not None:
        fields["latency"] = latency_figures(latency)
    return fields


def _build_result(workload, run, real: Throughput, compute: Throughput | None, losses, peak_bytes, peak_kind, wall_s, host) -> BenchResult:
    compute_sps = compute.summary.median if compute else None
    input_bound = max(0.0, 1.0 - real.summary.median / compute_sps) if compute_sps else None
    loss_values = tuple(torch.stack(losses).tolist()) if losses else ()
    batch_size = run.loader.batch_size or workload.batch_size
    return BenchResult(
        workload=workload.name,
        config=run.config.non_default(),  # the workload's own DataLoader arguments included
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
