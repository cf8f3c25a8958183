"""What a bench measures and how its figures are defined, from the meter's output: `BenchOptions`
(how long and how precisely), `throughput_figures` and `latency_figures` (the one definition of each
figure of a measured phase), and `build_script_bench` (a script's `BenchResult`, built inside its
process by `torchpace.script.probe`). Running a workload's step under a config is
`torchpace.trial.bench.run_bench`; this module starts nothing and prepares nothing.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import torch

from torchpace.host import probe_host
from torchpace.measure.latency import Latency
from torchpace.measure.memory import read_peak_memory
from torchpace.measure.result import (THROUGHPUT, BenchResult, LatencyFigures, RankFigures, ScriptInfo, StepShape,
                                      ThroughputFigures, find_straggler)
from torchpace.measure.timing import WARMUP_SHARE, Throughput, TimingOptions, window_for
from torchpace.records import from_json


@dataclass(frozen=True)
class BenchOptions:
    """How long and how precisely to measure."""

    max_time_s: float = 60.0
    target_ci_rel: float = 0.02
    compute_only: bool = True
    window_s: float | None = None  # default: max_time_s / 40, within [0.1, 1.0] s
    latency: bool | None = None  # batch-1 latency percentiles; None: for inference workloads only
    # the warm-up's own cap (None: its share of max_time_s); a separate run of a comparison measures a share
    # of the time but may warm up as a whole trial would
    warmup_s: float | None = None
    # what a paired comparison's turns measure: `throughput` (windows of the real step), or `latency` (single
    # batch-1 calls; the real step's throughput is then measured after the turns, alone)
    turns: str = THROUGHPUT

    def warmup_extra_s(self, share: float = WARMUP_SHARE) -> float:
        """Seconds the warm-up may run beyond its `share` of `max_time_s` (`warmup_s`): the measuring after it
        keeps its own length (`TimingOptions.warmup_extra_s`)."""
        return 0.0 if self.warmup_s is None else max(0.0, self.warmup_s - share * self.max_time_s)

    def timing(self, warmup_share: float | None = None) -> TimingOptions:
        """The meter's options; for the first warm-up, whose deadline is `warmup_share` of `max_time_s`, the extra
        time `warmup_s` gives it (none for a phase warmed up already)."""
        window = self.window_s or window_for(self.max_time_s)
        extra_s = self.warmup_extra_s(warmup_share) if warmup_share is not None else 0.0
        return TimingOptions(window_s=window, target_ci_rel=self.target_ci_rel, warmup_extra_s=extra_s)


def throughput_figures(real: Throughput, samples_known: bool = True) -> ThroughputFigures:
    """The figures of a measured phase (the one definition, for both bench modes).

    The meter measured samples/s when `samples_known`, else steps/s; steps/s is always reported, as
    the median over windows of steps per second with its own CI.
    """
    summary = real.summary
    step_rates = tuple(w.steps / w.elapsed_s for w in real.windows if w.elapsed_s > 0)
    steps = real.step_summary
    known = samples_known or None  # None blanks every samples/s figure
    return ThroughputFigures(
        samples_per_s=known and summary.median, samples_per_s_ci_low=known and summary.ci_low,
        samples_per_s_ci_high=known and summary.ci_high, samples_per_s_iqr=known and summary.iqr,
        window_samples_per_s=tuple(w.samples_per_s for w in real.windows) if samples_known else (),
        ci_rel_halfwidth=summary.ci_rel_halfwidth, noise_warning=summary.noisy, step_time_s=real.step_time_s,
        windows=summary.n, measured_steps=real.measured_steps, warmup_s=real.warmup_s, warmup_steps=real.warmup_steps,
        warmup_converged=real.warmup_converged, stopped_by=real.stopped_by, steps_per_s=steps.median,
        steps_per_s_ci_low=steps.ci_low, steps_per_s_ci_high=steps.ci_high, window_steps_per_s=step_rates)


def latency_figures(latency: Latency) -> LatencyFigures:
    """The figures of a batch-1 latency measurement (`torchpace.measure.latency`)."""
    s = latency.summary
    return LatencyFigures(batch_size=1, p50_s=s.p50_s, p90_s=s.p90_s, p99_s=s.p99_s, p50_ci_low_s=s.p50_ci_low_s,
                          p50_ci_high_s=s.p50_ci_high_s, ci_rel_halfwidth=s.ci_rel_halfwidth, calls=s.n,
                          warmup_s=latency.warmup_s, stopped_by=latency.stopped_by)


def build_script_bench(real: Throughput, *, samples_known: bool, device, losses: list[float], wall_s: float,
                       measured_wait_s: float | None, batch_size: int | None, backwards_per_step: int,
                       script: dict[str, Any], other_load_cores: float | None = None,
                       ranks: tuple[RankFigures, ...] = (), global_batch_size: int | None = None,
                       input_wait_frac: float | None = None, peak_bytes: int | None = None) -> BenchResult:
    """The BenchResult of a script measured from inside its process (`torchpace.script.hook`).

    There is no compute-only ceiling for a script (its batches cannot be replayed), so
    `input_bound_frac` is the measured share of window time spent inside the DataLoader iterator's
    `__next__` (None when the script read no DataLoader), and `compute_only_samples_per_s` is None. `config` is left empty: the parent, which
    planned the run, fills it in. `other_load_cores` is read by the caller over the measurement, as
    `torchpace.measure.contention` defines it.

    A job of several processes (`ranks`, one `RankFigures` each, measured by `torchpace.script.job`): `real` is
    the job's windows (every rank's samples per wall second), `batch_size` rank 0's samples of one step and
    `global_batch_size` every rank's, `input_wait_frac` the ranks' mean share of time waiting on a DataLoader,
    `peak_bytes` the largest rank's, and the straggler, if any, is named (`find_straggler`).
    """
    device = device if device is not None else torch.device("cpu")
    elapsed_s = sum(w.elapsed_s for w in real.windows)
    own_peak, peak_kind = read_peak_memory(device)
    info = from_json(ScriptInfo, script)
    if input_wait_frac is None and elapsed_s > 0 and measured_wait_s is not None:
        input_wait_frac = min(1.0, measured_wait_s / elapsed_s)
    world = max(1, len(ranks))
    return BenchResult(
        workload=shlex.join(info.command) or "script", config={}, device=str(device),
        step=StepShape(batch_size=batch_size, grad_accumulation=max(1, backwards_per_step), world_size=world,
                       global_batch_size=global_batch_size if ranks else batch_size),
        throughput=throughput_figures(real, samples_known), compute_only_samples_per_s=None,
        input_bound_frac=input_wait_frac,
        peak_memory_bytes=max(own_peak, peak_bytes or 0), peak_memory_kind=peak_kind, loss_values=tuple(losses),
        wall_time_s=wall_s, host=probe_host().summary(), script=info, other_load_cores=other_load_cores,
        ranks=tuple(ranks), straggler=find_straggler(ranks) if len(ranks) > 1 else None)
