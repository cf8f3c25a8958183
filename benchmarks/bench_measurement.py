"""Measurement truth and stability of `torchpace bench` (run: `make bench`).

1. Truth: for each built-in training workload, torchpace's samples/s vs a plain hand-written
   PyTorch loop over the same number of steps, timed from outside with perf_counter: both
   torchpace's aggregate over its measured windows (what an outside timer sees) and its reported
   median. Runs interleave A B A B (this host drifts ±10% run to run) and the median of the
   per-round ratios is printed.
2. Instrumentation cost: the bench loop's own per-step bookkeeping (window timing, loader cycling,
   loss collection) timed around a no-op step, as a fraction of the workload's step time.
3. Stability: five repeated benches of the same config; spread of their medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from torchpace.host import probe_host
from torchpace.measure.bench import BenchOptions
from torchpace.measure.timing import TimingOptions, measure_throughput
from torchpace.trial.bench import run_bench
from torchpace.workload import load_workload

from _args import count, seconds


def plain_loop_samples_per_s(name: str, warmup_steps: int, steps: int) -> float:
    """A hand-written training loop (no torchpace code in the timed part)."""
    w = load_workload(name)
    loader = torch.utils.data.DataLoader(w.dataset, batch_size=w.batch_size, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(w.seed))
    model = w.model.train()
    opt = w.optimizer(model.parameters())
    sched = w.scheduler(opt) if w.scheduler else None

    def batches():
        while True:
            yield from loader

    it = batches()

    def one_step():
        batch = next(it)
        opt.zero_grad(set_to_none=True)
        loss = w.loss(model(batch[0]), batch)
        loss.backward()
        if w.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), w.clip_grad_norm)
        opt.step()
        if sched:
            sched.step()

    for _ in range(warmup_steps):
        one_step()
    start = time.perf_counter()
    for _ in range(steps):
        one_step()
    return steps * w.batch_size / (time.perf_counter() - start)


def torchpace_samples_per_s(name: str, max_time_s: float, host) -> tuple[float, float, int, float]:
    """(median samples/s, step time s, measured steps, aggregate samples/s over all measured windows).

    The aggregate (all samples / all window time) is what a timer around the same steps from outside
    would see; the median is torchpace's reported, outlier-robust figure.
    """
    r = run_bench(load_workload(name), None, BenchOptions(max_time_s=max_time_s, compute_only=False), host=host)
    t = r.throughput
    per_window = t.measured_steps // t.windows * r.step.batch_size
    aggregate = t.windows * per_window / sum(per_window / sps for sps in t.window_samples_per_s)
    return t.samples_per_s, t.step_time_s, t.measured_steps, aggregate


def instrumentation_overhead_s(host) -> float:
    """Seconds per step that the bench loop adds around a step that does nothing."""
    def noop() -> int:
        return 1

    clock = time.perf_counter
    start = clock()
    result = measure_throughput(noop, clock, lambda: None, TimingOptions(window_s=0.2), start + 2, start + 4)
    return 1.0 / result.summary.median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["tabular", "language", "vision"])
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--max-time", type=seconds, default=20.0)
    parser.add_argument("--repeats", type=count, default=5)
    args = parser.parse_args()
    host = probe_host()
    overhead_s = instrumentation_overhead_s(host)
    print(f"bench loop overhead: {overhead_s * 1e6:.2f} us per step (no-op step)")
    print(f"{'workload':10} {'aggregate/plain':>16} {'median/plain':>13} {'rounds (aggregate/plain)':>32} {'overhead/step':>14}")
    for name in args.workloads:
        agg_ratios, med_ratios, step_s = [], [], []
        for _ in range(args.rounds):  # A B A B: torchpace then plain, same process, same host state
            median, step_time_s, steps, aggregate = torchpace_samples_per_s(name, args.max_time, host)
            plain = plain_loop_samples_per_s(name, warmup_steps=5, steps=steps)  # the same number of steps
            agg_ratios.append(aggregate / plain)
            med_ratios.append(median / plain)
            step_s.append(step_time_s)
        rounds = " ".join(f"{r:.3f}" for r in agg_ratios)
        print(f"{name:10} {statistics.median(agg_ratios):>16.3f} {statistics.median(med_ratios):>13.3f} {rounds:>32} "
              f"{overhead_s / statistics.median(step_s):>14.4%}", flush=True)
    medians = [torchpace_samples_per_s("tabular", args.max_time, host)[0] for _ in range(args.repeats)]
    print(flush=True)
    spread = (max(medians) - min(medians)) / statistics.median(medians)
    print(f"stability: {args.repeats} benches of tabular: medians {', '.join(f'{m:,.0f}' for m in medians)} samples/s; "
          f"spread (max-min)/median = {spread:.1%}")


if __name__ == "__main__":
    main()
