"""What sampling costs: `torchpace monitor` over a `sleep` child, the sampler thread's CPU time as a
percentage of one core.

Method: the sampler thread reads `time.thread_time()` when it starts and when it stops, so the
figure is that thread's own CPU time (user + system) divided by its wall time — the monitor loop,
the child and the rest of the process are not in it. The whole torchpace process's CPU time
(`time.process_time()`, every thread, the child excluded) is printed alongside. The budget is 1% of one
core at 1 Hz.

Usage:
    python benchmarks/bench_monitor.py [--duration 30] [--interval 1] [--check]
"""

from __future__ import annotations

import argparse
import io
import sys

from rich.console import Console

from torchpace.monitor.live import PlainView
from torchpace.monitor.run import MonitorOptions, run_monitor

from _args import seconds

_BUDGET_CORE_PCT = 1.0  # the target: sampling at 1 Hz costs under 1% of one core


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=seconds, default=30.0, help="seconds the sleep child runs (default 30)")
    parser.add_argument("--interval", type=seconds, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--check", action="store_true", help="exit 1 when over the 1%% budget")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = MonitorOptions(command=("sleep", f"{args.duration:g}"), interval_s=args.interval)
    result = run_monitor(options, PlainView(Console(file=io.StringIO())))
    core_pct = 100.0 * result.sampler_cpu_s / result.sampler_wall_s
    per_sample_ms = 1000.0 * result.sampler_cpu_s / max(1, result.sample_count + 1)
    verdict = "within" if core_pct < _BUDGET_CORE_PCT else "OVER"
    print(f"bench_monitor: {result.sample_count} samples every {args.interval:g} s over a {args.duration:g} s sleep")
    print(f"  sampler thread: {result.sampler_cpu_s:.4f} s CPU / {result.sampler_wall_s:.2f} s wall "
          f"= {core_pct:.3f}% of one core ({verdict} the {_BUDGET_CORE_PCT:g}% budget); "
          f"{per_sample_ms:.2f} ms CPU per reading")
    print(f"  whole torchpace process: {result.process_cpu_s:.3f} s CPU "
          f"= {100.0 * result.process_cpu_s / result.wall_s:.3f}% of one core")
    return 1 if args.check and verdict == "OVER" else 0


if __name__ == "__main__":
    sys.exit(main())
