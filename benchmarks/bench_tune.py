"""Does greedy find the best config, and cheaply? (run: `make bench-tune`)

For each workload, over a reduced knob space:
1. an exhaustive grid measures every config: the oracle best;
2. greedy, tpe and random then each run with the same trial budget (greedy's trial count).
Each strategy's pick is scored by the *grid's* measurement of that same config, so a lucky noisy
measurement cannot beat the oracle. Printed per workload: picked / oracle, trials used, wall time,
and tuned / default speedup. Targets: greedy >= 0.95 of the oracle with <= 30% of the oracle's trials,
and greedy beats or ties tpe and random on at least 2 of 3 workloads.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from torchpace.host import probe_host
from torchpace.tune.tuner import TuneOptions, Tuner

SPACES = {
    "tabular": {"threads.intra_op", "data.num_workers", "precision.amp", "optimizer.impl"},
    "vision": {"data.num_workers", "data.persistent_workers", "model.channels_last", "precision.amp"},
    "language": {"threads.intra_op", "precision.amp", "optimizer.impl", "data.micro_batch_size"},
}


def _key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


def run_strategy(workload, strategy, knobs, max_trials, trial_time_s, guard_steps, workdir, host):
    options = TuneOptions(workload=workload, strategy=strategy, knobs=frozenset(knobs), max_trials=max_trials,
                          budget_s=24 * 3600, storage=f"sqlite:///{workdir / (strategy + '.db')}", out=workdir / f"{strategy}.toml",
                          trial_time_s=trial_time_s, guard_steps=guard_steps, profile_baseline=strategy == "greedy")
    start = time.monotonic()
    outcome = Tuner(options, host).run()
    return outcome, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(SPACES))
    parser.add_argument("--trial-time", type=float, default=6.0)
    parser.add_argument("--guard-steps", type=int, default=10)
    args = parser.parse_args()
    host = probe_host()
    print(f"{'workload':9} {'strategy':8} {'picked/oracle':>13} {'trials':>6} {'wall s':>7} {'tuned/default':>13}  picked config")
    wins = 0
    for workload in args.workloads:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            grid, grid_s = run_strategy(workload, "grid", SPACES[workload], None, args.trial_time, args.guard_steps, workdir, host)
            measured = {_key(t["config"]): t["samples_per_s"] for t in grid.trials
                        if t["status"] == "ok" and t["guard"] != "fail" and t["samples_per_s"]}
            default_sps = measured.get((), grid.baseline["samples_per_s"])
            oracle = max(measured.values())
            print(f"{workload:9} {'grid':8} {1.0:>13.3f} {len(grid.trials):>6} {grid_s:>7.0f} {oracle / default_sps:>13.2f}  "
                  f"{grid.best_config}")
            scores = {}
            greedy_trials = None
            for strategy in ("greedy", "tpe", "random"):
                outcome, wall_s = run_strategy(workload, strategy, SPACES[workload], greedy_trials, args.trial_time,
                                               args.guard_steps, workdir, host)
                greedy_trials = greedy_trials or len(outcome.trials)
                picked = measured.get(_key(outcome.best_config))
                scores[strategy] = picked / oracle if picked else 0.0
                print(f"{workload:9} {strategy:8} {scores[strategy]:>13.3f} {len(outcome.trials):>6} {wall_s:>7.0f} "
                      f"{(picked or 0) / default_sps:>13.2f}  {outcome.best_config}")
            print(f"{workload:9} greedy used {greedy_trials / len(grid.trials):.0%} of the oracle's trials")
            wins += scores["greedy"] >= max(scores["tpe"], scores["random"]) - 1e-9
    print(f"greedy beat or tied tpe and random on {wins} of {len(args.workloads)} workloads")


if __name__ == "__main__":
    main()
