"""`make bench-speedup`: does a tune make a realistically sized job faster, and as fast as an expert's config?

For each workload (`resnet`, `gpt`), its plain script (`examples/scripts/<name>_train.py --size SIZE`)
is tuned unmodified (`torchpace tune --budget ... -- python script`), then, in the same run, the tuned
config is compared in turns with the script's defaults and with an expert's config (`torchpace compare
--config A --config B`: B / A with its 95% CI, two processes taking turns):

- **tuned/default**: what the tune gained over what the user started from;
- **tuned/expert**: against the config a performance engineer writes by hand without measuring,
  every lever that applies on this host (`expert_config`): bf16 autocast where the host computes it
  natively (else fp16 on a GPU), TF32 matmuls and cuDNN autotuning on a GPU, channels_last for a conv
  net, compile, the fused optimizer on a GPU, a worker per core (up to 16) for a decoding loader.

Each row also gives the tuned arm's samples/s and, on a GPU, its MFU: the step's FLOPs (counted with
`torch.utils.flop_counter.FlopCounterMode` on the meta device, forward and backward of one sample)
times samples/s, over the GPU's dense bf16 peak (`PEAK_BF16_TFLOPS`), so the distance to the physical
limit is on the page.

Usage:
    python benchmarks/bench_speedup.py [--workloads resnet,gpt] [--size small|full] [--budget 15m]
        [--trial-time 8] [--compare-time 30] [--knob NAME ...] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _args import keep_folder, new_run_folder, seconds

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = ("resnet", "gpt")
# dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from the vendors' data sheets, by the name torch
# reports; the first entry whose words all appear in the name is taken (H100 NVL/PCIe before the SXM default)
PEAK_BF16_TFLOPS = (
    (("H200",), 989.4), (("H100", "NVL"), 835.0), (("H100", "PCIe"), 756.0), (("H100",), 989.4),
    (("GH200",), 989.4), (("B200",), 2250.0), (("A100",), 312.0), (("A10G",), 70.0), (("A10",), 125.0),
    (("L40S",), 362.0), (("L40",), 181.0), (("L4",), 121.0), (("RTX", "4090"), 165.2), (("RTX", "3090"), 71.0),
)


@dataclass(frozen=True)
class Row:
    """One workload's proof: the tuned config and its two ratios with their 95% CIs."""

    workload: str
    size: str
    tuned: dict[str, Any]
    expert: dict[str, Any]
    tune_s: float
    tune_trials: int
    vs_default: tuple[float | None, float | None, float | None]  # ratio, CI low, CI high
    vs_expert: tuple[float | None, float | None, float | None]
    tuned_samples_per_s: float | None
    flops_per_sample: float | None
    mfu: float | None
    failure: str | None = None


# ---- pure parts ----------------------------------------------------------------------------------------


def script_command(workload: str, size: str) -> list[str]:
    """The unmodified script of `workload` at `size`, as a user runs it (after `--`)."""
    return ["python", str(REPO / "examples" / "scripts" / f"{workload}_train.py"), "--size", size]


def expert_config(workload: str, host) -> dict[str, Any]:
    """What an expert writes by hand for `workload` on `host`, without measuring: every lever that applies
    here (by the knobs' own host rules), none tried."""
    from torchpace.knobs import REGISTRY
    from torchpace.knobs.base import ScriptSubject

    subject = ScriptSubject(name=f"{workload}_train.py")
    gpu = host.cuda_available
    wanted: dict[str, Any] = {"precision.amp": "bf16"}
    if gpu and REGISTRY["precision.amp"].host_reason("bf16", host):
        wanted["precision.amp"] = "fp16"  # a GPU without bf16: fp16 with its GradScaler
    if workload == "resnet":
        wanted["model.channels_last"] = True
        if gpu:
            wanted.update({"backends.cudnn_benchmark": True, "data.num_workers": min(16, host.usable_cores)})
    if gpu:
        wanted.update({"precision.matmul": "high", "compile.mode": "default", "optimizer.impl": "fused"})
    elif workload == "gpt":
        wanted["compile.mode"] = "default"  # nanoGPT's recipe: bf16 and compile
    return {name: value for name, value in wanted.items()
            if REGISTRY[name].applies(host, subject) is None and REGISTRY[name].host_reason(value, host) is None}


def gpu_peak_flops(name: str) -> float | None:
    """The dense bf16 peak of the GPU named `name`, in FLOP/s; None for a GPU not in the table."""
    for words, tflops in PEAK_BF16_TFLOPS:
        if all(word in name for word in words):
            return tflops * 1e12
    return None


def mfu(samples_per_s: float | None, flops_per_sample: float | None, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation: the FLOPs the step does per second over the device's peak."""
    if not samples_per_s or not flops_per_sample or not peak_flops:
        return None
    return samples_per_s * flops_per_sample / peak_flops


def ratio_of(comparison: dict[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(B / A, its CI's low and high end) of a `torchpace compare --json` document."""
    return comparison.get("ratio"), comparison.get("ratio_ci_low"), comparison.get("ratio_ci_high")


def render(rows: list[Row], device: str) -> str:
    """The table: one line per workload (pure)."""

    def figure(ratio) -> str:
        value, low, high = ratio
        return "-" if value is None else f"{value:.2f}x [{low:.2f}, {high:.2f}]" if low is not None else f"{value:.2f}x"

    lines = [f"on {device}", f"{'workload':<14} {'tuned/default':<22} {'tuned/expert':<22} {'samples/s':>10} {'MFU':>6}  tuned config"]
    for row in rows:
        if row.failure:
            lines.append(f"{row.workload + ' ' + row.size:<14} FAIL: {row.failure}")
            continue
        rate = f"{row.tuned_samples_per_s:,.1f}" if row.tuned_samples_per_s else "-"
        util = f"{row.mfu:.1%}" if row.mfu is not None else "-"
        config = ", ".join(f"{k}={v}" for k, v in row.tuned.items()) or "defaults"
        lines.append(f"{row.workload + ' ' + row.size:<14} {figure(row.vs_default):<22} {figure(row.vs_expert):<22} "
                     f"{rate:>10} {util:>6}  {config}")
        lines.append(f"{'':<14} expert: {', '.join(f'{k}={v}' for k, v in row.expert.items())}; tune {row.tune_s:.0f} s, "
                     f"{row.tune_trials} trials")
    return "\n".join(lines)


# ---- measuring -----------------------------------------------------------------------------------------


def flops_per_sample(workload: str, size: str) -> float:
    """Forward + backward FLOPs of one sample of `workload` at `size`, counted on the meta device."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from torchpace.examples import gpt, resnet

    with torch.device("meta"):
        if workload == "resnet":
            model, crop = resnet.build_model(size), resnet.RESNET_SIZES[size].crop
            images, labels = torch.randn(1, 3, crop, crop), torch.zeros(1, dtype=torch.long)
            loss_of = lambda: torch.nn.functional.cross_entropy(model(images), labels)  # noqa: E731
        else:
            model = gpt.build_model(size)
            tokens = torch.zeros(1, gpt.GPT_SIZES[size].block_size, dtype=torch.long)
            loss_of = lambda: gpt.next_token_loss(model(tokens), tokens)  # noqa: E731
        with FlopCounterMode(display=False) as counter:
            loss_of().backward()
    return float(counter.get_total_flops())


def torchpace(args: list[str], timeout_s: float, cwd: Path) -> dict[str, Any]:
    """Run `torchpace ARGS --json` and return its JSON (RuntimeError naming the exit and last line)."""
    done = subprocess.run([sys.executable, "-m", "torchpace", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip() and "output is kept" not in line]
        raise RuntimeError(f"`torchpace {shlex.join(args[:3])} ...` exit {done.returncode}: " + " / ".join(lines[-3:])[-600:])
    return json.loads(done.stdout)


def write_config(path: Path, values: dict[str, Any]) -> Path:
    """A torchpace.toml with these knob values (the defaults: none)."""
    lines = ["schema_version = 1", "[knobs]"] + [f'"{k}" = {json.dumps(v)}' for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def prove(workload: str, size: str, host, workdir: Path, args: argparse.Namespace) -> Row:
    """Tune `workload`'s script, then compare the tuned config with the defaults and with the expert's."""
    command = ["--", *script_command(workload, size)]
    expert = expert_config(workload, host)
    knobs = [arg for name in args.knob for arg in ("--knob", name)]
    start = time.monotonic()
    tune = torchpace(["tune", "--budget", f"{args.budget:g}s", "--trial-time", f"{args.trial_time:g}", *knobs,
                      "--storage", f"sqlite:///{workdir / 'studies.db'}", "--study", f"speedup-{workload}-{size}",
                      "--out", str(workdir / f"{workload}-tuned.toml"), "--json", *command],
                     args.budget * 1.5 + 600, workdir)
    tune_s = time.monotonic() - start
    tuned = dict(tune.get("best_config") or {})
    defaults = write_config(workdir / f"{workload}-defaults.toml", {})
    tuned_toml = write_config(workdir / f"{workload}-tuned-knobs.toml", tuned)
    expert_toml = write_config(workdir / f"{workload}-expert.toml", expert)
    compare = ["compare", "--max-time", f"{args.compare_time:g}", "--json"]
    vs_default = torchpace([*compare, "--config", str(defaults), "--config", str(tuned_toml), *command],
                           args.compare_time * 6 + 600, workdir)
    vs_expert = torchpace([*compare, "--config", str(expert_toml), "--config", str(tuned_toml), *command],
                          args.compare_time * 6 + 600, workdir)
    rate = vs_default["b"]["figure"] if vs_default.get("unit") == "samples/s" else None
    flops = flops_per_sample(workload, size)
    peak = gpu_peak_flops(host.gpus[0].name) if host.gpus else None
    return Row(workload, size, tuned, expert, tune_s, len(tune.get("trials", [])), ratio_of(vs_default),
               ratio_of(vs_expert), rate, flops, mfu(rate, flops, peak))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: resnet, gpt")
    parser.add_argument("--size", choices=("small", "full"), default=None, help="default: full on a GPU, else small")
    parser.add_argument("--budget", type=seconds, default=900.0, help="each tune's budget in seconds (default 900)")
    parser.add_argument("--trial-time", type=seconds, default=8.0, help="each trial's measuring time (default 8)")
    parser.add_argument("--compare-time", type=seconds, default=30.0, help="each comparison's --max-time (default 30)")
    parser.add_argument("--knob", action="append", default=[], help="restrict the tunes to these knobs (repeatable)")
    parser.add_argument("--keep", type=keep_folder, default=None,
                        help="keep the studies and configs in a new folder DIR/run-N of this run")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown or not args.workloads:
        parser.error(f"--workloads {','.join(unknown) or '(none)'} is not valid: give one or more of {', '.join(WORKLOADS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from torchpace.host import probe_host

    host = probe_host()
    size = args.size or ("full" if torch.cuda.is_available() else "small")
    device = host.gpus[0].name if host.gpus else f"{host.cpu_model} ({host.usable_cores} cores)"
    rows = []
    with tempfile.TemporaryDirectory(prefix="torchpace-speedup-") as tmp:
        workdir = (new_run_folder(args.keep) if args.keep else Path(tmp)).resolve()
        for workload in args.workloads:
            print(f"{workload} ({size}): tuning for {args.budget:g} s, then comparing ...", file=sys.stderr, flush=True)
            try:
                rows.append(prove(workload, size, host, workdir, args))
            except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as err:
                rows.append(Row(workload, size, {}, expert_config(workload, host), 0.0, 0, (None,) * 3, (None,) * 3,
                                None, None, None, failure=str(err)))
    print(json.dumps([asdict(row) for row in rows], indent=2) if args.json else render(rows, device))
    return 0 if all(row.failure is None for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
