"""What `torchpace profile` costs the step: step time under torch.profiler vs without it.

Method: one `prepare()`d workload; blocks of `--steps` steps alternate A B A B for `--rounds`
rounds. A: plain steps, no phase labels, no profiler. B: the same steps inside
`torch.profiler.profile` with the activities, `profile_memory=True` and `record_function` phase
labels `torchpace profile` uses. Each step (next batch + step) is timed with perf_counter; a block's
figure is its median step time; a round's ratio is B's median over A's. Interleaving cancels the
host's drift (±10% run to run here). The median of the rounds' ratios is printed: ratio - 1 is the
profiler's overhead on step time. The profiler's post-processing after a block (building and
exporting the trace) is not step time and is printed separately.

Usage:
    python benchmarks/bench_profile.py [--workload tabular --workload vision] [--rounds 5] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from torchpace.engine.loader import LoaderCycle
from torchpace.profile.capture import profiler_activities
from torchpace.runtime import prepare
from torchpace.workload import load_workload

from _args import count


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append", help="built-in or spec (repeatable; default tabular, vision)")
    parser.add_argument("--rounds", type=count, default=5, help="A B rounds (default 5)")
    parser.add_argument("--steps", type=count, default=5, help="steps per block (default 5)")
    parser.add_argument("--threads", type=count, default=None,
                        help="intra-op threads (default: torch's); 1 is steadier on a busy host")
    return parser.parse_args(argv)


def timed_steps(run, cycle: LoaderCycle, steps: int) -> list[float]:
    """Seconds per step (next batch + step) for `steps` steps."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        with torch.profiler.record_function("torchpace.input_wait"):
            batch = cycle.next()
        run.step(batch)
        times.append(time.perf_counter() - start)
    return times


def profiled_block(run, cycle: LoaderCycle, steps: int) -> tuple[float, float]:
    """(median step s, post-processing s) of one block under the profiler, as `torchpace profile` runs it."""
    run.options.label_phases = True
    prof = torch.profiler.profile(activities=profiler_activities(run.device), profile_memory=True)
    prof.__enter__()
    try:
        median_s = statistics.median(timed_steps(run, cycle, steps))
    finally:
        stop = time.perf_counter()
        prof.__exit__(None, None, None)
        post_s = time.perf_counter() - stop
    return median_s, post_s


def plain_block(run, cycle: LoaderCycle, steps: int) -> float:
    run.options.label_phases = False
    return statistics.median(timed_steps(run, cycle, steps))


def bench(spec: str, rounds: int, steps: int, threads: int | None) -> None:
    config = {"threads.intra_op": threads} if threads else None
    with prepare(load_workload(spec), config) as run:
        cycle = LoaderCycle(run.loader)
        try:
            plain_block(run, cycle, 2)  # warm-up: lazy init, optimizer state, allocator growth
            ratios, plains, posts = [], [], []
            for _ in range(rounds):
                plain_s = plain_block(run, cycle, steps)
                profiled_s, post_s = profiled_block(run, cycle, steps)
                ratios.append(profiled_s / plain_s)
                plains.append(plain_s)
                posts.append(post_s)
        finally:
            cycle.close()
    ratio = statistics.median(ratios)
    print(f"{spec}: step {statistics.median(plains) * 1000:.1f} ms plain; profiled/plain median ratio {ratio:.3f} "
          f"(overhead {ratio - 1:+.1%}; rounds {', '.join(f'{r:.2f}' for r in ratios)}); "
          f"trace post-processing {statistics.median(posts):.2f} s per {steps}-step block")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = args.threads or torch.get_num_threads()
    print(f"bench_profile: {args.rounds} rounds of A (plain) / B (torch.profiler) blocks of {args.steps} steps, "
          f"{threads} intra-op threads")
    for spec in args.workload or ["tabular", "vision"]:
        bench(spec, args.rounds, args.steps, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
