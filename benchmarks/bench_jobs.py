"""Jobs of several processes in script mode (`make bench-jobs`): unmodified 2-rank scripts, each measured as one job.

For each client, every figure measured in this run:

1. **same run**: `torchpace bench -- LAUNCHER SCRIPT --stamps F`: the job's steps/s over torchpace's measured
   windows against rank 0's own clock on the very same steps (a timestamp per optimizer step, written by the
   script or its framework's callback), as a ratio framework / torchpace (target 1.00 +- 0.03), with the
   job's samples/s, world size and global batch as bench reports them;
2. **scaling** (`--scaling`): `torchpace bench --scaling 1,2 -- ...` of the plain DDP script: speedup and
   scaling efficiency of 2 ranks over 1, with their 95% CIs (on a 2-core host two ranks share the cores
   one rank's threads used: read the efficiency as this host's, not the script's).

Clients: `ddp` (examples/scripts/ddp_train.py under torchrun), `lightning` (lightning_train.py with
`Trainer(devices=2, strategy="ddp")`, which starts its own second rank), `hf` (hf_trainer_train.py, a
Hugging Face `Trainer`, under torchrun).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _args import count, fmt, keep_folder, new_run_folder, seconds, show
from bench_frameworks import same_run_ratio  # rank 0's stamps bound the job's windows: its steps end them on every rank

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "scripts"
TORCHRUN = ["python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
# the command after `--` (the script's long-run arguments: it trains until torchpace ends it)
CLIENTS = {
    "ddp": [*TORCHRUN, str(EXAMPLES / "ddp_train.py")],
    "lightning": ["python", str(EXAMPLES / "lightning_train.py"), "--epochs", "1000", "--devices", "2", "--strategy", "ddp"],
    "hf": [*TORCHRUN, str(EXAMPLES / "hf_trainer_train.py"), "--max-steps", "100000"],
}
MODULES = {"ddp": "torch", "lightning": "pytorch_lightning", "hf": "transformers"}
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def torchpace(args, cwd: Path, *options: str, command: list[str]) -> dict:
    """`torchpace bench OPTIONS --json -- COMMAND` in a fresh process: its JSON, or {"error": ...}."""
    proc = subprocess.run([sys.executable, "-m", "torchpace", "bench", "--max-time", str(args.max_time), "--json", *options,
                           "--", *command], cwd=cwd, env={**os.environ, **OFFLINE}, capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout)


def run_client(client: str, args, cwd: Path) -> dict:
    stamps = cwd / f"{client}-stamps"
    result = torchpace(args, cwd, command=[*CLIENTS[client], "--stamps", str(stamps)])
    if "error" in result:
        return {"error": result["error"]}
    ranks = result.get("ranks") or []
    return {"same_run_ratio": same_run_ratio(result, Path(f"{stamps}.rank0")),
            "samples_per_s": result.get("samples_per_s"), "steps_per_s": result.get("steps_per_s"),
            "world_size": result.get("world_size"), "global_batch_size": result.get("global_batch_size"),
            "rank_steps_per_s": [r.get("steps_per_s") for r in ranks],
            "straggler": (result.get("straggler") or {}).get("rank")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--max-time", type=seconds, default=15.0, help="bench cap per run, seconds")
    parser.add_argument("--scaling", type=count, default=1, help="rounds of `bench --scaling 1,2` of the ddp script")
    parser.add_argument("--keep", type=keep_folder, default=None,
                        help="keep stamps and results.json in a new folder DIR/run-N of this run")
    args = parser.parse_args()
    for client in args.clients:
        try:
            __import__(MODULES[client])
        except ImportError:
            parser.error(f"{client}: {MODULES[client]} is not installed (pip install -e '.[frameworks]')")
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as tmp:
        cwd = new_run_folder(args.keep) if args.keep else Path(tmp)
        report: dict = {}
        with console.status("starting") as status:
            for client in args.clients:
                status.update(f"{client}: bench of the 2-rank job")
                report[client] = run_client(client, args, cwd)
            for r in range(args.scaling):
                status.update(f"scaling 1,2 of the ddp script, round {r + 1}/{args.scaling}")
                scaled = torchpace(args, cwd, "--scaling", "1,2", command=CLIENTS["ddp"])
                report.setdefault("scaling", []).append(scaled)
        (cwd / "results.json").write_text(json.dumps(report, indent=2, default=str))
    table = Table(title="2-rank jobs in script mode (gloo on this CPU)")
    for column in ("client", "world, global batch", "samples/s", "rank steps/s", "same run: script / torchpace"):
        table.add_column(column)
    for name in args.clients:
        row = report[name]
        if "error" in row:
            table.add_row(name, "-", "-", "-", row["error"])
            continue
        table.add_row(name, f"{row['world_size']}, {row['global_batch_size']}", fmt(row["samples_per_s"], "{:,.0f}"),
                      ", ".join(fmt(v, "{:.1f}") for v in row["rank_steps_per_s"]), fmt(row["same_run_ratio"], "{:.3f}"))
    return show(table, report)


if __name__ == "__main__":
    sys.exit(main())
