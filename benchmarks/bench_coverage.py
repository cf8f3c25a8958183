"""How often an A/A comparison's 95% CI leaves 1 out (run: `make bench-coverage`, `ARGS="--busy 2"`).

A config compared with itself should give a CI that holds 1 about 19 times in 20. This runs `--repeats`
A/A comparisons per cell, the cells interleaved (each repeat runs every cell once, in turn), where a cell
is a thread count (`--threads`: the defaults' and one intra-op thread) and a length:

- `tune`: a tune's comparison of `--trial-time` seconds, the warm-ups spent out of it, as the tuner runs
  its A/A comparison (arm B runs the guard steps, arm A none);
- `compare`: `torchpace compare`'s default, `--compare-time` seconds of rounds after the warm-ups.

Each cell is run as the product runs it (its `PairOptions`: the tuner's `executor.pair_options`, compare's
rounds). Printed: each comparison's ratio with its CI, rounds, other processes' load and wall time; per cell
how many 95% CIs left 1 out (a comparison with fewer rounds than a 95% CI needs is counted apart: `compare`
calls it "too few rounds", a tune compares it again), the spread of the medians and the median wall time. `--busy N` runs N processes that spin meanwhile, as another user's jobs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from torchpace.host import probe_host
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI
from torchpace.protocol import TrialSpec
from torchpace.trial.pair import run_pair
from torchpace.trial.schedule import PairOptions
from torchpace.tune.executor import pair_options

from _args import BusyLoops, busy, count, seconds

LENGTHS = ("tune", "compare")
GUARD_STEPS = 30  # a tune's default: its A/A comparison's arm B runs them, as every candidate does


def cell_options(length: str, args) -> tuple[PairOptions, float, int]:
    """(how the cell's comparison runs, its rounds' seconds, arm B's guard steps), as the product runs it."""
    if length == "tune":
        return tune_options(args.trial_time), args.trial_time, GUARD_STEPS
    return compare_options(args.compare_time), args.compare_time, 0


def tune_options(trial_time_s: float) -> PairOptions:
    """A tune's A/A comparison, by the tuner's own rule."""
    return pair_options("noise", trial_time_s)


def compare_options(max_time_s: float) -> PairOptions:
    """`torchpace compare`'s comparison of `--max-time` seconds of rounds (`compare/run.py`)."""
    return PairOptions(rounds_s=max_time_s)


def one(workload: str, config: dict, length: str, args, host) -> dict:
    options, rounds_s, guard = cell_options(length, args)
    spec_a = TrialSpec(workload=workload, config=config, max_time_s=rounds_s)
    spec_b = TrialSpec(workload=workload, config=config, max_time_s=rounds_s, guard_steps=guard)
    started = time.perf_counter()
    pair = run_pair(spec_a, spec_b, host, timeout_s=rounds_s * 4 + 120, options=options)
    s = pair.summary
    loads = [x for x in (pair.other_load_a, pair.other_load_b) if x is not None]
    return {"ok": pair.ok, "ratio": s.median if s else None, "low": s.ci_low if s else None,
            "high": s.ci_high if s else None, "rounds": s.n if s else 0, "coverage": s.ci_coverage if s else None,
            "load": max(loads) if loads else None,
            "wall_s": time.perf_counter() - started, "error": "" if pair.ok else (pair.a.error or pair.b.error)[-300:]}


def misses(p: dict) -> bool:
    """An A/A comparison with a 95% CI (the rounds it needs) that leaves 1 out."""
    return p["ratio"] is not None and p["rounds"] >= MIN_WINDOWS_FOR_CI and not p["low"] <= 1.0 <= p["high"]


def too_few(p: dict) -> bool:
    """An A/A comparison with fewer rounds than a 95% CI needs: `compare` says "too few rounds", a tune
    compares it again."""
    return p["ratio"] is not None and p["rounds"] < MIN_WINDOWS_FOR_CI


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="tabular")
    parser.add_argument("--threads", default="default,1", help="comma-separated: `default` (the defaults) and/or counts")
    parser.add_argument("--lengths", default=",".join(LENGTHS), help=f"comma-separated: {', '.join(LENGTHS)}")
    parser.add_argument("--repeats", type=count, default=20)
    parser.add_argument("--trial-time", type=seconds, default=20.0, help="a tune's trial time (its default: 20)")
    parser.add_argument("--compare-time", type=seconds, default=30.0, help="compare's --max-time (its default: 30)")
    parser.add_argument("--busy", type=busy, default=0, metavar="N", help="processes that spin meanwhile (0-8)")
    parser.add_argument("--json", type=Path, help="also write every comparison here")
    args = parser.parse_args(argv)
    lengths = [x.strip() for x in args.lengths.split(",") if x.strip()]
    if not lengths or any(x not in LENGTHS for x in lengths):
        parser.error(f"--lengths: {args.lengths!r}; valid: {', '.join(LENGTHS)}")
    threads = [x.strip() for x in args.threads.split(",") if x.strip()]
    try:
        configs = {t: ({} if t == "default" else {"threads.intra_op": int(t)}) for t in threads}
    except ValueError:
        parser.error(f"--threads: {args.threads!r}; valid: `default` or whole numbers")
    host = probe_host()
    cells = [(t, length) for t in threads for length in lengths]
    results: dict[str, list[dict]] = {f"{t}/{length}": [] for t, length in cells}
    with BusyLoops(args.busy):
        print(f"# bench-coverage: {args.workload}, {args.repeats} A/A comparisons per cell, tune {args.trial_time:g} s, "
              f"compare {args.compare_time:g} s, {args.busy} busy process(es), {host.usable_cores} usable cores",
              flush=True)
        for repeat in range(args.repeats):
            for t, length in cells[repeat % len(cells):] + cells[:repeat % len(cells)]:
                p = one(args.workload, configs[t], length, args, host)
                results[f"{t}/{length}"].append(p)
                if p["ratio"] is None:
                    print(f"  {repeat + 1:2} threads {t:7} {length:7}: failed: {p['error']}", flush=True)
                    continue
                print(f"  {repeat + 1:2} threads {t:7} {length:7}: {p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}] "
                      f"{p['rounds']} rounds, load {p['load'] or 0:.1f}, {p['wall_s']:.0f} s"
                      + ("  LEAVES 1 OUT" if misses(p) else "  (too few rounds for a 95% CI)" if too_few(p) else ""),
                      flush=True)
    print("\n| threads | length | comparisons | 95% CIs that leave 1 out | too few rounds | medians (range) | median rounds "
          "| median wall |")
    print("|---|---|---|---|---|---|---|---|")
    for t, length in cells:
        runs = [p for p in results[f"{t}/{length}"] if p["ratio"] is not None]
        if not runs:
            print(f"| {t} | {length} | 0 | - | - | - | - | - |")
            continue
        medians = [p["ratio"] for p in runs]
        with_ci = len(runs) - sum(map(too_few, runs))
        print(f"| {t} | {length} | {len(runs)} | {sum(map(misses, runs))} of {with_ci} | {sum(map(too_few, runs))} | "
              f"{statistics.median(medians):.3f} "
              f"({min(medians):.3f}-{max(medians):.3f}) | {statistics.median(p['rounds'] for p in runs):.0f} | "
              f"{statistics.median(p['wall_s'] for p in runs):.0f} s |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
