"""Inference tuning on the built-in `inference` workload, default vs tuned (run: `python benchmarks/bench_inference.py`).

1. `tune --objective latency` and `tune --objective throughput` (greedy, fresh studies in a temp dir);
2. confirmation: the default config and each tuned config are benched again in fresh trial
   processes, interleaved (default, latency-tuned, throughput-tuned, repeated `--rounds` times),
   and the median of the rounds is reported, so host drift during the tunes cannot flatter a result;
3. printed: batch-1 p50 latency (with its 95% CI) and samples/s at the tuned batch size, default vs
   tuned, the accepted knobs, and the tuned models' output error vs the fp32 eager reference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from torchpace.host import probe_host
from torchpace.trial import TrialSpec, run_trial
from torchpace.tune.tuner import TuneOptions, Tuner

from _args import count, seconds

WORKLOAD = "inference"


def run_tune(objective: str, workdir: Path, trial_time_s: float, budget_s: float, host):
    """One greedy tune; returns its outcome and wall seconds."""
    options = TuneOptions(workload=WORKLOAD, objective=objective, storage=f"sqlite:///{workdir / 'studies.db'}",
                          out=workdir / f"{objective}.toml", trial_time_s=trial_time_s, budget_s=budget_s,
                          export_path=workdir / f"{objective}.pt2")
    start = time.monotonic()
    outcome = Tuner(options, host).run()
    return outcome, time.monotonic() - start


def bench_config(config: dict, max_time_s: float, host) -> dict:
    """The bench figures of `config` in a fresh trial process (accuracy reported, never enforced)."""
    spec = TrialSpec(workload=WORKLOAD, config=config, max_time_s=max_time_s, accuracy_batches=4, accuracy_enforce=False)
    result = run_trial(spec, host, timeout_s=max_time_s * 3 + 120)
    if not result.ok:
        raise SystemExit(f"confirmation bench of {config} failed ({result.status}): {result.error}")
    return result.bench.to_dict()


def confirm(configs: dict[str, dict], rounds: int, max_time_s: float, host) -> dict[str, list[dict]]:
    """Bench each named config `rounds` times, interleaved."""
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for _ in range(rounds):
        for name, config in configs.items():
            runs[name].append(bench_config(config, max_time_s, host))
    return runs


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def print_report(outcomes: dict, runs: dict[str, list[dict]]) -> None:
    print(f"\n{'config':22} {'p50 batch 1':>12} {'(CI of one run)':>22} {'samples/s':>10} {'batch':>5}  accuracy vs fp32")
    for name, bench_runs in runs.items():
        last = bench_runs[-1]
        ci = f"[{last['latency_p50_ci_low_s'] * 1e3:.3f}, {last['latency_p50_ci_high_s'] * 1e3:.3f}] ms"
        accuracy = last["accuracy"]["reason"] if last.get("accuracy") else ""
        print(f"{name:22} {_median(bench_runs, 'latency_p50_s') * 1e3:>9.3f} ms {ci:>22} "
              f"{_median(bench_runs, 'samples_per_s'):>10.1f} {last['batch_size']:>5}  {accuracy}")
    default = runs["default"]
    for objective, key, better in (("latency", "latency_p50_s", lambda d, t: d / t), ("throughput", "samples_per_s", lambda d, t: t / d)):
        tuned = runs[f"tuned for {objective}"]
        gain = better(_median(default, key), _median(tuned, key))
        outcome = outcomes[objective]
        knobs = ", ".join(f"{a.knob}={a.value}" for a in outcome.accepted) or "none (nothing beat the noise)"
        print(f"{objective}: {gain:.2f}x the default (confirmation medians); tune's own estimate {outcome.speedup:.2f}x; "
              f"accepted: {knobs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trial-time", type=seconds, default=12.0, help="bench cap per tune trial, seconds")
    parser.add_argument("--budget", type=seconds, default=1500.0, help="budget per tune, seconds")
    parser.add_argument("--rounds", type=count, default=2, help="interleaved confirmation rounds")
    parser.add_argument("--confirm-time", type=seconds, default=20.0, help="bench cap per confirmation run, seconds")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = parser.parse_args()
    host = probe_host()
    outcomes, walls = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for objective in ("latency", "throughput"):
            outcomes[objective], walls[objective] = run_tune(objective, Path(tmp), args.trial_time, args.budget, host)
            o = outcomes[objective]
            print(f"tune --objective {objective}: {len(o.trials)} trials in {walls[objective]:.0f} s, best {o.best_config}, "
                  f"export {o.export and (o.export.format or o.export.error)}")
        configs = {"default": {}, "tuned for latency": outcomes["latency"].best_config,
                   "tuned for throughput": outcomes["throughput"].best_config}
        runs = confirm(configs, args.rounds, args.confirm_time, host)
    print_report(outcomes, runs)
    if args.json:
        args.json.write_text(json.dumps({"outcomes": {k: v.to_dict() for k, v in outcomes.items()}, "tune_wall_s": walls,
                                         "confirmation": runs}, indent=2, default=str))


if __name__ == "__main__":
    main()
