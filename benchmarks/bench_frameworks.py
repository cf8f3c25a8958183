"""PyTorch Lightning and the Hugging Face Trainer in script mode (`make bench-frameworks`).

For each example script (examples/scripts/lightning_train.py, hf_trainer_train.py), every figure
measured side by side in this run:

1. **same run**: `torchpace bench -- python SCRIPT --stamps F`: torchpace's steps/s over its measured
   windows against the framework's own clock on the very same steps (a Lightning callback's / a
   `TrainerCallback`'s timestamp per optimizer step), as a ratio (target 1.00 +- 0.02);
2. **framework clock**: `torchpace bench -- python SCRIPT` against the script run plainly (`python
   SCRIPT`, no torchpace), whose framework prints its own figure (the median of the Lightning callback's
   epoch steps/s after the first epoch; the Trainer's `train_steps_per_second`, which includes its first
   steps), interleaved
   A B A B for `--rounds` rounds: the median of the per-round ratios (target 0.9-1.1 on a quiet host);
3. **compile**: `torchpace bench --set compile.mode=default -- python SCRIPT` against the defaults,
   interleaved the same way: the median ratio of steps/s, and what was compiled (graphs, graph breaks).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _args import count, fmt, keep_folder, new_run_folder, seconds, show

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "scripts"
# script, its long-run arguments (trained until torchpace ends it), its plain-run arguments, the clock's pattern
CLIENTS = {
    "lightning": ("lightning_train.py", ["--epochs", "1000"], ["--epochs", "4"],
                  r"epoch \d+: ([\d.]+) steps/s \(Lightning callback clock\)"),
    "hf": ("hf_trainer_train.py", ["--max-steps", "100000"], ["--max-steps", "400"], r"train_steps_per_second ([\d.]+)"),
}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def environment(threads: int | None) -> dict[str, str]:
    env = {**os.environ, **OFFLINE}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def bench(client: str, args, cwd: Path, options: tuple[str, ...] = (), script_args: tuple[str, ...] = ()) -> dict:
    """`torchpace bench OPTIONS -- python SCRIPT ARGS` in a fresh process: its JSON, or {"error": ...}."""
    script, long_args, _, _ = CLIENTS[client]
    proc = subprocess.run([sys.executable, "-m", "torchpace", "bench", "--max-time", str(args.max_time), "--json", *options,
                           "--", "python", str(EXAMPLES / script), *long_args, *script_args],
                          cwd=cwd, env=environment(args.threads), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout)


def plain_run(client: str, args, cwd: Path) -> dict:
    """The script run without torchpace: the steps/s its framework prints (the Trainer's one figure; the median
    of the Lightning callback's epochs after the first, which holds start-up like torchpace's first step)."""
    script, _, plain_args, pattern = CLIENTS[client]
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *plain_args], cwd=cwd, env=environment(args.threads),
                          capture_output=True, text=True, timeout=1800)
    found = [float(value) for value in re.findall(pattern, proc.stdout)]
    if proc.returncode != 0 or not found:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return {"steps_per_s": statistics.median(found[1:] or found)}


def same_run_ratio(result: dict, stamps_path: Path) -> float | None:
    """torchpace's time over its complete measured windows / the framework's stamps over the same steps."""
    stamps = [float(line) for line in stamps_path.read_text().split()] if stamps_path.exists() else []
    if "error" in result or not result.get("windows"):
        return None
    size = result["measured_steps"] // result["windows"]
    first = result["warmup_steps"]
    complete = min(result["windows"], (len(stamps) - 1 - first) // size)
    if complete < 1:
        return None
    inside_s = sum(size / rate for rate in result["window_steps_per_s"][:complete])
    return (stamps[first + complete * size] - stamps[first]) / inside_s  # > 1: torchpace's clock ran faster


def interleaved(arms: dict, rounds: int, progress) -> dict[str, list[dict]]:
    """Each arm's results over `rounds` rounds, the arms run in turn (rotated each round)."""
    results: dict[str, list[dict]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            progress(f"round {r + 1}/{rounds}: {name}")
            results[name].append(arms[name]())
    return results


def median_ratio(top: list[dict], bottom: list[dict]) -> float | None:
    values = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(top, bottom) if a.get("steps_per_s") and b.get("steps_per_s")]
    return statistics.median(values) if values else None


def run_client(client: str, args, cwd: Path, progress) -> dict:
    stamps = cwd / f"{client}-stamps.txt"
    progress(f"{client}: same run")
    same = bench(client, args, cwd, script_args=("--stamps", str(stamps)))
    clock = interleaved({"torchpace": lambda: bench(client, args, cwd), "framework": lambda: plain_run(client, args, cwd)},
                        args.rounds, progress)
    row = {"same_run_ratio": same_run_ratio(same, stamps),
           "torchpace_steps_per_s": [r.get("steps_per_s") or r.get("error") for r in clock["torchpace"]],
           "framework_steps_per_s": [r.get("steps_per_s") or r.get("error") for r in clock["framework"]],
           "clock_ratio": median_ratio(clock["torchpace"], clock["framework"])}
    if not args.no_compile:
        compiled = interleaved({"compile": lambda: bench(client, args, cwd, ("--set", "compile.mode=default")),
                                "default": lambda: bench(client, args, cwd)}, args.rounds, progress)
        summaries = [(r.get("script") or {}).get("compile") for r in compiled["compile"] if "error" not in r]
        row.update(compile_ratio=median_ratio(compiled["compile"], compiled["default"]),
                   compile_steps_per_s=[r.get("steps_per_s") or r.get("error") for r in compiled["compile"]],
                   default_steps_per_s=[r.get("steps_per_s") or r.get("error") for r in compiled["default"]],
                   compiled=summaries[0] if summaries else None)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--max-time", type=seconds, default=15.0, help="bench cap per run, seconds")
    parser.add_argument("--threads", type=count, default=None,
                        help="OMP_NUM_THREADS for every run (default: as set here; on a shared host 1 avoids OpenMP stalls)")
    parser.add_argument("--no-compile", action="store_true", help="skip the compile comparison")
    parser.add_argument("--keep", type=keep_folder, default=None,
                        help="keep stamps, logs and results.json in a new folder DIR/run-N of this run")
    args = parser.parse_args()
    for client in args.clients:
        module = {"lightning": "pytorch_lightning", "hf": "transformers"}[client]
        try:
            __import__(module)
        except ImportError:
            parser.error(f"{client}: {module} is not installed (pip install -e '.[frameworks]')")
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
        cwd = new_run_folder(args.keep) if args.keep else Path(tmp)
        with console.status("starting") as status:
            report = {client: run_client(client, args, cwd, lambda text: status.update(text)) for client in args.clients}
        (cwd / "results.json").write_text(json.dumps(report, indent=2, default=str))
    table = Table(title="frameworks in script mode (medians of interleaved rounds)")
    for column in ("client", "same run: framework / torchpace", "torchpace / framework clock", "compile / default",
                   "graphs, breaks"):
        table.add_column(column)
    for name, row in report.items():
        compiled = row.get("compiled") or {}
        table.add_row(name, fmt(row["same_run_ratio"], "{:.3f}"), fmt(row["clock_ratio"], "{:.3f}"),
                      fmt(row.get("compile_ratio"), "{:.2f}x"),
                      f"{compiled.get('graphs', '-')}, {compiled.get('graph_breaks', '-')}" if compiled else "-")
    return show(table, report)


if __name__ == "__main__":
    sys.exit(main())
