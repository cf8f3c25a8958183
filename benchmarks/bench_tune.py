"""Does greedy find the best config, and cheaply? (run: `make bench-tune`)

For each workload, over a reduced knob space (`SPACES`; each holds `threads.intra_op`, as `tune`'s own
space does on a CPU: under other processes' load greedy decides it first, and it changes how every
other comparison behaves):
1. an exhaustive grid measures every config once: its best few are the oracle candidates;
2. greedy (by paired comparisons), tpe and random then each run with the same budget of trial
   processes (greedy's count: each paired comparison counts the processes it started, two less the
   arms it took back from the comparison before);
3. the grid's top 3 and every strategy's pick are each compared with the defaults the way greedy
   decides, in alternation (`torchpace.trial.pair.run_pair`), `--rounds` times, interleaved: the
   config with the highest median ratio is the oracle;
4. every pick that is not the oracle's config is compared with the oracle head to head, in
   alternation, `--rounds` times: picked / oracle is the median of those paired ratios (1 for the
   oracle's own config).

Every figure scored comes from steps 3 and 4: the best of 25-55 single grid measurements is biased
upward on a noisy host (the winner's curse), so neither the oracle nor a strategy's pick is scored on
a lucky single run; and picked / oracle is measured as one paired ratio rather than divided out of
two comparisons with the defaults, whose noise would add (two configs that differ only by a value
equal to the default, `threads.intra_op=2` on a 2-core host, scored 0.78 that way). Printed per
workload: picked / oracle, trial processes used, wall time, and tuned / default speedup. Targets:
greedy >= 0.95 of the oracle with <= 30% of the grid's trial processes, and greedy beats or ties tpe
and random on at least 2 of 3 workloads.
`--busy N` runs N processes that spin for the whole benchmark (another user's jobs). `--strategies
greedy` runs greedy alone (tune's default; tpe and random only serve the comparison of strategies).

`--remeasure-time S` gives the scoring comparisons (steps 3 and 4) S seconds of rounds each instead
of the trial time: a loaded run wants tune's own trial time (20 s) for greedy, whose warm-ups come out
of it, while a scoring comparison's rounds come after its warm-ups and need no more than the quiet
default.

`--keep DIR` keeps every study (SQLite), each strategy's torchpace.toml and `results.json`
(all single and re-measured figures) under DIR. `--grid-from DIR` takes the grid's single runs from
an earlier `--keep DIR` instead of running the grid again (it only picks the top 3 to re-measure;
everything scored is still measured in this run).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from rich.progress import Progress

from torchpace.host import probe_host
from torchpace.trial import TrialSpec
from torchpace.trial.pair import run_pair
from torchpace.trial.schedule import PairOptions
from torchpace.tune.space import build_space
from torchpace.tune.tuner import TuneOptions, Tuner
from torchpace.workload import load_workload

from _args import BusyLoops, busy, count, keep_folder, seconds

SPACES = {
    "tabular": {"threads.intra_op", "data.num_workers", "precision.amp", "optimizer.impl"},
    "vision": {"threads.intra_op", "data.num_workers", "model.channels_last", "precision.amp"},
    "language": {"threads.intra_op", "precision.amp", "optimizer.impl", "data.micro_batch_size"},
}
STRATEGIES = ("greedy", "tpe", "random")
GRID_TOP = 3
WIN_TOLERANCE = 0.02  # "ties": re-measured picks within 2% are the same config as far as this host can tell


def _key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def run_strategy(workload, strategy, knobs, max_trials, trial_time_s, guard_steps, workdir, host, progress, total=None):
    options = TuneOptions(workload=workload, strategy=strategy, knobs=frozenset(knobs), max_trials=max_trials,
                          budget_s=24 * 3600, storage=f"sqlite:///{workdir / (strategy + '.db')}", out=workdir / f"{strategy}.toml",
                          trial_time_s=trial_time_s, guard_steps=guard_steps, profile_baseline=strategy == "greedy")
    task = progress.add_task(f"{workload}: {strategy}", total=total or max_trials)

    def on_event(kind, **data):
        if kind == "trial_done":
            progress.advance(task)

    start = time.monotonic()
    outcome = Tuner(options, host, on_event=on_event).run()
    progress.remove_task(task)
    return outcome, time.monotonic() - start


def paired_ratio(workload, reference: dict, config: dict, trial_time_s, host) -> float:
    """`config` over `reference`, compared in alternation the way greedy decides: the median of the rounds'
    ratios (0 for a failed comparison)."""
    pair = run_pair(TrialSpec(workload=workload, config=reference, max_time_s=trial_time_s),
                    TrialSpec(workload=workload, config=config, max_time_s=trial_time_s), host,
                    timeout_s=trial_time_s * 3 + 60, options=PairOptions(rounds_s=trial_time_s))
    return pair.summary.median if pair.ok else 0.0


def remeasure(workload, configs: dict[str, dict], rounds, trial_time_s, host, progress) -> dict[str, list[float]]:
    """Each config's speedup over the defaults: compared with them in alternation, `rounds` times, the
    configs interleaved (0 for a failed comparison; the defaults themselves are 1)."""
    figures: dict[str, list[float]] = {key: [] for key in configs}
    task = progress.add_task(f"{workload}: comparing {len(configs)} configs with the defaults", total=rounds * len(configs))
    keys = list(configs)
    for round_index in range(rounds):
        for key in keys[round_index % len(keys):] + keys[:round_index % len(keys)]:
            figures[key].append(paired_ratio(workload, {}, configs[key], trial_time_s, host) if configs[key] else 1.0)
            progress.advance(task)
    progress.remove_task(task)
    return figures


def head_to_head(workload, oracle: dict, picked: dict, rounds, trial_time_s, host, progress) -> list[float]:
    """`picked` over `oracle`, compared in alternation `rounds` times (0 for a failed comparison)."""
    task = progress.add_task(f"{workload}: a pick against the oracle", total=rounds)
    ratios = []
    for _ in range(rounds):
        ratios.append(paired_ratio(workload, oracle, picked, trial_time_s, host))
        progress.advance(task)
    progress.remove_task(task)
    return ratios


def trial_processes(outcome) -> int:
    """Trial processes a tune started: a trial measured alone is one, a paired comparison two, less the arms
    it took back from the comparison before (`PairRecord.processes_started`), or one per separate run."""
    return sum(trial.pair.processes_started if trial.pair else 1 for trial in outcome.trials)


def earlier_grid(workload, grid_from: Path, workdir: Path):
    """The grid study of an earlier `--keep` run (copied here): its trial rows as an outcome, and its wall time."""
    import optuna

    from torchpace.tune.outcome import best_by_search, trial_rows

    shutil.copy(grid_from / workload / "grid.db", workdir / "grid.db")
    url = f"sqlite:///{workdir / 'grid.db'}"
    rows = trial_rows(optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url))
    best = best_by_search(rows)  # as a grid tune picks its best
    earlier = json.loads((grid_from / "results.json").read_text()) if (grid_from / "results.json").exists() else []
    wall_s = next((row["wall_s"] for result in earlier if result["workload"] == workload
                   for row in result["rows"] if row["strategy"] == "grid"), float("nan"))
    return SimpleNamespace(trials=rows, best_config=dict(best.config), decisions=()), wall_s


def bench_workload(workload, args, workdir: Path, host, progress) -> dict:
    space = SPACES[workload]
    if args.grid_from:
        grid, grid_s = earlier_grid(workload, args.grid_from, workdir)
    else:
        grid_size = math.prod(len(k.values) for k in build_space(host, load_workload(workload), only=frozenset(space)))
        grid, grid_s = run_strategy(workload, "grid", space, None, args.trial_time, args.guard_steps, workdir, host, progress,
                                    total=grid_size + 1)  # + the enqueued baseline
    single = {_key(t.config): t.throughput.value for t in grid.trials
              if t.status == "ok" and t.guard != "fail" and t.throughput and t.throughput.value}
    runs = {"grid": {"outcome": grid, "wall_s": grid_s}}
    greedy_trials = None
    for strategy in args.strategies:
        outcome, wall_s = run_strategy(workload, strategy, space, greedy_trials, args.trial_time, args.guard_steps,
                                       workdir, host, progress)
        greedy_trials = greedy_trials or trial_processes(outcome)
        runs[strategy] = {"outcome": outcome, "wall_s": wall_s}
    top = sorted(single, key=single.get, reverse=True)[:GRID_TOP]
    configs = {key: json.loads(key) for key in [_key({}), *top, *(_key(r["outcome"].best_config) for r in runs.values())]}
    figures = remeasure(workload, configs, args.rounds, args.remeasure_time or args.trial_time, host, progress)
    median = {key: statistics.median(values) for key, values in figures.items()}
    oracle_key = max(configs, key=median.get)
    oracle = median[oracle_key]
    if not oracle:
        raise SystemExit(f"{workload}: every comparison with the defaults failed; see the trial errors "
                         "(run again with --keep DIR to keep the studies)")
    against_oracle = {oracle_key: [1.0]}  # the oracle's own config: the same config, no measurement
    for run in runs.values():
        key = _key(run["outcome"].best_config)
        if key not in against_oracle:
            against_oracle[key] = head_to_head(workload, configs[oracle_key], configs[key], args.rounds,
                                               args.remeasure_time or args.trial_time, host, progress)
    rows = []
    for name, run in runs.items():
        key = _key(run["outcome"].best_config)
        rows.append({"strategy": name, "picked_over_oracle": statistics.median(against_oracle[key]),
                     "picked_over_oracle_rounds": against_oracle[key], "trials": trial_processes(run["outcome"]),
                     "wall_s": run["wall_s"], "tuned_over_default": median[key],
                     "picked": run["outcome"].best_config, "picked_single_samples_per_s": single.get(key),
                     "picked_remeasured": figures[key], "decisions": [d.to_dict() for d in run["outcome"].decisions],
                     "trial_figures": [(t.slot, dict(t.config), t.status, t.throughput.value if t.throughput else None)
                                       for t in run["outcome"].trials]})
    return {"workload": workload, "rows": rows, "oracle_config": configs[oracle_key], "oracle_speedup": oracle,
            "grid_trials": len(grid.trials), "greedy_trials": greedy_trials,
            "grid_top": [{"config": configs[k], "single": single[k], "remeasured": figures[k]} for k in top]}


def print_workload(console, result: dict) -> None:
    for row in result["rows"]:
        console.print(f"{result['workload']:9} {row['strategy']:8} {row['picked_over_oracle']:>13.3f} {row['trials']:>6} "
                      f"{row['wall_s']:>7.0f} {row['tuned_over_default']:>13.2f}  {row['picked']}", highlight=False)
    for entry in result["grid_top"]:
        console.print(f"{'':9} grid top: single {entry['single']:>9,.0f}/s, compared with the defaults "
                      f"{statistics.median(entry['remeasured']):>6.2f}x  {entry['config']}", highlight=False)
    console.print(f"{result['workload']:9} oracle (best compared with the defaults) {result['oracle_speedup']:.2f}x "
                  f"{result['oracle_config']}; greedy used {result['greedy_trials'] / result['grid_trials']:.0%} "
                  f"of the grid's trial processes", highlight=False)


def greedy_wins(result: dict) -> bool:
    score = {row["strategy"]: row["picked_over_oracle"] for row in result["rows"]}
    return score["greedy"] >= max(score.get("tpe", 0.0), score.get("random", 0.0)) - WIN_TOLERANCE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(SPACES), choices=list(SPACES))
    parser.add_argument("--trial-time", type=seconds, default=6.0, help="each trial's bench cap, seconds")
    parser.add_argument("--remeasure-time", type=seconds,
                        help="seconds of rounds of each scoring comparison (with the defaults, with the oracle); "
                             "default: --trial-time")
    parser.add_argument("--guard-steps", type=count, default=10)
    parser.add_argument("--rounds", type=count, default=2,
                        help="comparisons of each scored config with the defaults, interleaved, and of each pick with the oracle")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES),
                        help="greedy and which of the others to run (default: all three)")
    parser.add_argument("--busy", type=busy, default=0, metavar="N", help="processes that spin meanwhile (0-8)")
    parser.add_argument("--keep", type=keep_folder, help="keep the studies, torchpace.toml files and results.json here")
    parser.add_argument("--grid-from", type=Path, help="an earlier --keep DIR: take the grid's single runs from it")
    args = parser.parse_args()
    if args.rounds < 1 or args.trial_time <= 0:
        parser.error(f"--rounds must be >= 1 and --trial-time > 0 (got {args.rounds} and {args.trial_time})")
    if "greedy" not in args.strategies:
        parser.error("--strategies must include greedy: the others run at greedy's count of trial processes")
    args.strategies = [s for s in STRATEGIES if s in args.strategies]  # greedy first, for its count
    if args.keep and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep} is not empty; give a new or empty directory (its studies would be resumed)")
    missing = [w for w in args.workloads if args.grid_from and not (args.grid_from / w / "grid.db").exists()]
    if missing:
        parser.error(f"--grid-from {args.grid_from} has no grid study for {', '.join(missing)} "
                     f"(expected {args.grid_from / missing[0] / 'grid.db'}, as --keep writes it)")
    console = Console(soft_wrap=True)
    host = probe_host()
    console.print(f"{'workload':9} {'strategy':8} {'picked/oracle':>13} {'trials':>6} {'wall s':>7} {'tuned/default':>13}  picked config")
    results = []
    with ExitStack() as stack, BusyLoops(args.busy), Progress(console=console, transient=True) as progress:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for workload in args.workloads:
            workdir = root / workload
            workdir.mkdir(parents=True, exist_ok=True)
            result = bench_workload(workload, args, workdir, host, progress)
            results.append(result)
            print_workload(console, result)
        if args.keep:
            (args.keep / "results.json").write_text(json.dumps(results, indent=2, default=str))
    at_bar = sum(row["picked_over_oracle"] >= 0.95 for r in results for row in r["rows"] if row["strategy"] == "greedy")
    console.print(f"greedy's pick at >= 0.95 of the oracle (head to head) on {at_bar} of {len(results)} workloads")
    if len(args.strategies) > 1:
        wins = sum(greedy_wins(r) for r in results)
        console.print(f"greedy beat or tied (within {WIN_TOLERANCE:.0%}) {' and '.join(args.strategies[1:])} on {wins} of "
                      f"{len(results)} workloads")
    console.print(f"tuned / default: medians of {args.rounds} interleaved comparisons with the defaults, in alternation"
                  + (f", beside {args.busy} busy process(es)" if args.busy else ""))


if __name__ == "__main__":
    main()
