"""Script mode against Workload mode on the same model, data and batch (`make bench-script`).

Each built-in workload also exists as a plain training script (examples/scripts/W_train.py, which
builds the same model and data and runs the usual loop). Three figures, every one measured side by
side in this run:

1. **bench ratio**: `torchpace bench -- python W_train.py` vs `torchpace bench W`, each in a fresh
   process, interleaved A B A B for `--rounds` rounds; the median of the per-round ratios of
   samples/s (target 0.97-1.03: the script's loop and the Workload's `prepare()` step do the same work);
2. **hook overhead**: the hook's own work per step (a DataLoader batch, a backward, an optimizer step
   fed to the same `ScriptProbe` and `WindowMeter` a script runs with), timed over many steps in this
   process, as a share of the script's measured step time (target under 1%);
3. **tune**: `torchpace tune W` and `torchpace tune -- python W_train.py` with the same budget on the
   knobs both can apply; each tuned config and the defaults re-measured interleaved (`--rounds`); the
   script's tuned/default speedup over the Workload's (target >= 0.9). `--no-tune` skips it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _args import count, keep_folder, new_run_folder, seconds

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "examples" / "scripts"
WORKLOADS = ("tabular", "language", "vision")
# knobs both modes can apply on a CPU host (the script reaches them through the launch hook)
SHARED_KNOBS = ("threads.intra_op", "data.num_workers", "data.persistent_workers", "precision.amp", "optimizer.impl")


def run_json(args: list[str], cwd: Path, timeout_s: float = 900) -> dict:
    """`torchpace ARGS --json` in a fresh process; its JSON, or {"error": ...}."""
    proc = subprocess.run([sys.executable, "-m", "torchpace", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout)


def bench_args(workload: str, max_time_s: float, config: Path | None, script: bool) -> list[str]:
    head = ["bench", "--max-time", str(max_time_s), "--json", *(["--config", str(config)] if config else [])]
    return [*head, "--", "python", str(SCRIPTS / f"{workload}_train.py")] if script else [*head, workload]


def interleaved(arms: dict[str, list[str]], rounds: int, cwd: Path, progress) -> dict[str, list[dict]]:
    """Each arm's results over `rounds` rounds, the arms run in turn (rotated each round)."""
    results: dict[str, list[dict]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            progress(f"round {r + 1}/{rounds}: {name}")
            results[name].append(run_json(arms[name], cwd))
    return results


def ratio(results: dict[str, list[dict]], top: str, bottom: str) -> float | None:
    """Median over rounds of top/bottom samples/s (rounds where either failed are left out)."""
    pairs = [(a.get("samples_per_s"), b.get("samples_per_s")) for a, b in zip(results[top], results[bottom])]
    values = [a / b for a, b in pairs if a and b]
    return statistics.median(values) if values else None


def hook_overhead_s(steps: int = 20000, batch: int = 64) -> float:
    """Seconds of the hook's own work per step: the events one step of a script produces (a DataLoader
    batch, a backward, an optimizer step), fed to a ScriptProbe whose meter never finishes."""
    import torch

    from torchpace.script.inprocess import HookReport
    from torchpace.script.probe import ScriptProbe
    from torchpace.script.spec import ScriptMeasure

    with tempfile.TemporaryDirectory() as tmp:
        spec = ScriptMeasure(result_path=str(Path(tmp) / "r.json"), max_time_s=1e9, target_ci_rel=0.0)
        probe = ScriptProbe(spec, HookReport())
        probe.on_optimizer_built()
        batch_data, loss, optimizer = (torch.zeros(batch, 4), torch.zeros(batch)), torch.tensor(1.0), object()
        start = time.perf_counter()
        for _ in range(steps):
            probe.on_batch(batch_data, 0.0)
            probe.on_backward(loss)
            probe.on_optimizer_step(optimizer)
        return (time.perf_counter() - start) / steps


def tune_and_remeasure(workload: str, args, cwd: Path, progress) -> dict:
    """Both modes tuned with the same budget and knobs; tuned and default configs re-measured interleaved."""
    knobs = [part for name in SHARED_KNOBS for part in ("--knob", name)]
    common = ["tune", "--budget", args.budget, "--trial-time", str(args.trial_time), "--guard-steps", "10", *knobs, "--json"]
    tomls = {"workload": cwd / f"{workload}-workload.toml", "script": cwd / f"{workload}-script.toml"}
    progress(f"tune {workload} (Workload)")
    tuned_w = run_json([*common, "--out", str(tomls["workload"]), "--study", f"w-{workload}", workload], cwd, 3600)
    progress(f"tune {workload} (script)")
    tuned_s = run_json([*common, "--out", str(tomls["script"]), "--study", f"s-{workload}", "--", "python",
                        str(SCRIPTS / f"{workload}_train.py")], cwd, 3600)
    arms = {"W default": bench_args(workload, args.max_time, None, False),
            "W tuned": bench_args(workload, args.max_time, tomls["workload"] if tomls["workload"].exists() else None, False),
            "S default": bench_args(workload, args.max_time, None, True),
            "S tuned": bench_args(workload, args.max_time, tomls["script"] if tomls["script"].exists() else None, True)}
    results = interleaved(arms, args.rounds, cwd, progress)
    w_speedup, s_speedup = ratio(results, "W tuned", "W default"), ratio(results, "S tuned", "S default")
    return {"workload_best": (tuned_w.get("best_config") if "error" not in tuned_w else tuned_w["error"]),
            "script_best": (tuned_s.get("best_config") if "error" not in tuned_s else tuned_s["error"]),
            "workload_speedup": w_speedup, "script_speedup": s_speedup,
            "script_over_workload": s_speedup / w_speedup if w_speedup and s_speedup else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--max-time", type=seconds, default=15.0, help="bench cap per run, seconds")
    parser.add_argument("--budget", default="4m", help="tune budget per mode")
    parser.add_argument("--trial-time", type=seconds, default=6.0)
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--keep", type=keep_folder, default=None,
                        help="keep studies, configs and results.json in a new folder DIR/run-N of this run")
    args = parser.parse_args()
    if args.rounds < 1 or args.max_time <= 0 or args.trial_time <= 0:
        parser.error("--rounds must be >= 1, --max-time and --trial-time > 0")
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="bench-script-") as tmp:
        cwd = new_run_folder(args.keep) if args.keep else Path(tmp)
        with console.status("starting") as status:
            report = run_all(args, cwd, lambda text: status.update(text))
        (cwd / "results.json").write_text(json.dumps(report, indent=2, default=str))
    table = Table(title="script mode vs Workload mode (medians of interleaved rounds)")
    for column in ("workload", "bench script/Workload", "hook overhead", "tuned/default W", "tuned/default script",
                   "script/W speedup"):
        table.add_column(column)
    for name, row in report.items():
        table.add_row(name, _fmt(row["bench_ratio"], "{:.3f}"), _fmt(row["hook_overhead_frac"], "{:.3%}"),
                      _fmt(row.get("tune", {}).get("workload_speedup"), "{:.2f}x"),
                      _fmt(row.get("tune", {}).get("script_speedup"), "{:.2f}x"),
                      _fmt(row.get("tune", {}).get("script_over_workload"), "{:.2f}"))
    Console().print(table)
    print(json.dumps(report, indent=2, default=str))
    return 0


def run_all(args, cwd: Path, progress) -> dict:
    overhead_s = hook_overhead_s()
    report = {}
    for workload in args.workloads:
        arms = {"workload": bench_args(workload, args.max_time, None, False),
                "script": bench_args(workload, args.max_time, None, True)}
        results = interleaved(arms, args.rounds, cwd, progress)
        steps = [r["step_time_s"] for r in results["script"] if r.get("step_time_s")]
        row = {"bench_ratio": ratio(results, "script", "workload"),
               "samples_per_s": {k: [r.get("samples_per_s") or r.get("error") for r in v] for k, v in results.items()},
               "hook_overhead_s_per_step": overhead_s,
               "hook_overhead_frac": overhead_s / statistics.median(steps) if steps else None}
        if not args.no_tune:
            row["tune"] = tune_and_remeasure(workload, args, cwd, progress)
        report[workload] = row
    return report


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


if __name__ == "__main__":
    sys.exit(main())
