"""1 vs 2 processes on the built-in `tabular` workload (run: `python benchmarks/bench_distributed.py`).

1. Each config is benched in a fresh trial process (2 processes: through torchrun, samples/s summed
   over the ranks between barriers), interleaved: 1 process, DDP x2, FSDP x2, repeated `--rounds`
   times; printed per config: the median samples/s of the rounds and the median of the per-round
   ratios to the 1-process run of the same round (so host drift cancels);
2. `torchpace profile` of each 2-process config: the collectives' share of the step (rank 0's trace).

The 1-process run uses every usable core for torch's intra-op threads; each of 2 ranks gets half
(`nproc_per_node` sets OMP_NUM_THREADS = usable cores / ranks), so the comparison is the same
cores used two ways. The per-process batch stays the workload's 256: 2 ranks step on a global
batch of 512.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from torchpace.host import probe_host
from torchpace.trial import TrialSpec, run_trial

from _args import count, seconds

WORKLOAD = "tabular"
CONFIGS = {
    "1 process": {},
    "DDP, 2 processes": {"nproc_per_node": 2, "distributed.strategy": "ddp"},
    "FSDP, 2 processes": {"nproc_per_node": 2, "distributed.strategy": "fsdp"},
}


def bench(config: dict, max_time_s: float, host) -> dict:
    result = run_trial(TrialSpec(workload=WORKLOAD, config=config, max_time_s=max_time_s), host, timeout_s=max_time_s * 3 + 120)
    if not result.ok:
        raise SystemExit(f"bench of {config} failed ({result.status}): {result.error}\n{result.stderr_tail}")
    return result.bench.to_dict()


def comm_share(config: dict) -> tuple[float, float]:
    """(share of the step in collectives, their ms per step) from `torchpace profile --json`."""
    sets = [part for name, value in config.items() for part in ("--set", f"{name}={value}")]
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "torchpace", "profile", WORKLOAD, *sets, "--steps", "10", "--python-steps",
                               "0", "--trace", str(Path(tmp) / "trace.json.gz"), "--json"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"profile of {config} failed:\n{done.stderr[-3000:]}")
    finding = next((f for f in json.loads(done.stdout)["findings"] if f["id"] == "profile.communication"), None)
    return (finding["data"]["comm_frac"], finding["data"]["comm_us_per_step"] / 1e3) if finding else (0.0, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count, default=3)
    parser.add_argument("--max-time", type=seconds, default=12.0, help="bench cap per run, seconds")
    args = parser.parse_args()
    host = probe_host()
    print(f"host: {host.cpu_model}, {host.usable_cores} usable cores; torch {host.torch_version}")
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds):
        for name, config in CONFIGS.items():
            runs[name].append(bench(config, args.max_time, host))
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {r[-1]['samples_per_s']:,.0f}/s" for n, r in runs.items()), flush=True)
    single = runs["1 process"]
    print(f"\n{'config':20} {'samples/s':>10} {'vs 1 process':>13} {'global batch':>12} {'step ms':>8} {'comm share':>11}")
    for name, config in CONFIGS.items():
        ratios = [r["samples_per_s"] / s["samples_per_s"] for r, s in zip(runs[name], single)]
        frac, ms = comm_share(config) if config else (0.0, 0.0)
        last = runs[name][-1]
        print(f"{name:20} {statistics.median(r['samples_per_s'] for r in runs[name]):>10,.0f} {statistics.median(ratios):>12.2f}x "
              f"{last['global_batch_size']:>12} {statistics.median(r['step_time_s'] for r in runs[name]) * 1e3:>8.2f} "
              f"{(f'{frac:.0%} ({ms:.1f} ms)' if config else '-'):>11}")


if __name__ == "__main__":
    main()
