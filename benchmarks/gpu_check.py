"""`make gpu-check`: every verb once on a CUDA host, in under 9 minutes, with one table at the end.

What it runs (each step is the real `torchpace` command line in its own process, with a time cap):

1. `doctor --json`: the host's findings (NVML GPU facts, CUDA/cuDNN/NCCL versions, pinned memory);
2. `bench` of `language` and `vision` at the defaults on `--device cuda`;
3. a short `tune` of each, restricted to the GPU knobs: AMP fp16/bf16, TF32 (`precision.matmul`),
   `backends.cudnn_benchmark`, `compile.mode`, pinned memory (`data.pin_memory`);
4. `profile` of `vision` (the trace, its verdict and the GPU-idle share);
5. `monitor` of a few seconds of CUDA matmuls, with NVML: the CSV must hold GPU utilisation;
6. `compare` of `language` with bf16 against the defaults: two processes on one GPU taking turns
   (the tunes above decide this way too).

`--part speedup` is the proof on real-sized jobs, in a box of its own (10 minutes): the `resnet`
(ResNet-50, 224 px, batch 256) and `gpt` (GPT-2 124M, 16 x 1024 tokens) scripts at full size, unmodified,
each tuned for a few minutes over the GPU's levers (bf16/fp16 with its GradScaler, TF32, cuDNN autotune,
channels_last, compile and its modes, the fused optimizer, loader workers), then the tuned config compared
in turns with the defaults and with an expert's config (`bench_speedup.expert_config`): tuned/default and
tuned/expert with their 95% CIs, the tuned samples/s and its MFU (the step's FLOPs, counted with
`torch.utils.flop_counter`, over the GPU's dense bf16 peak). `--part all` runs both boxes, one after the other.

Each row of the table is one step: its headline figure, `ok` or `FAIL` with the reason, and its
seconds. A step that would start after the time box is `skipped`, never silently dropped. `--keep DIR`
keeps each run's studies, configs, trace and CSV in a new folder of its own, `DIR/run-1`, `DIR/run-2`, ...,
so a rerun with the same `--keep` starts fresh studies and overwrites nothing an earlier run kept.

Exit codes: 0 every step ok; 1 a step failed; 2 bad arguments; 77 no CUDA device here. 77 is the
"skipped" code of the automake and meson test harnesses: a CI job on a CPU runner that calls
`make gpu-check` reads it as "not applicable here", distinct from a pass (0) and a failure (1).

Usage:
    python benchmarks/gpu_check.py [--part verbs|speedup|all] [--minutes 9] [--keep DIR] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from _args import keep_folder, minutes, new_run_folder, next_run_folder
from bench_speedup import expert_config, flops_per_sample, gpu_peak_flops, mfu, script_command, write_config

EXIT_NO_CUDA = 77  # automake/meson "skipped": see the module docstring
_BENCH_TIME_S = "20"
_TUNE_BUDGET = "90s"
_TRIAL_TIME_S = "4"
_COMPARE_TIME_S = "10"
_GPU_KNOBS = ("precision.amp", "precision.matmul", "backends.cudnn_benchmark", "compile.mode", "data.pin_memory")
# the speedup part: each full-size script tuned for a few minutes over the levers a GPU step moves, then compared
_SPEEDUP_MINUTES = 10.0
_SPEEDUP_BUDGET = "140s"
_SPEEDUP_TUNE_CAP_S = 170
_SPEEDUP_COMPARE_TIME_S = "8"
_SPEEDUP_COMPARE_CAP_S = 55
_SPEEDUP_KNOBS = ("precision.amp", "precision.matmul", "backends.cudnn_benchmark", "model.channels_last",
                  "compile.mode", "optimizer.impl", "data.num_workers")
_MONITOR_LOAD = ("import time, torch\n"
                 "x = torch.randn(4096, 4096, device='cuda')\n"
                 "end = time.monotonic() + 6\n"
                 "while time.monotonic() < end:\n"
                 "    x = (x @ x).tanh()\n"
                 "torch.cuda.synchronize()\n")


@dataclass(frozen=True)
class Step:
    """One command of the check: a name, its argv after `torchpace`, a time cap, and how to read its output."""

    name: str
    args: tuple[str, ...]
    cap_s: float
    read: Callable[[dict[str, Any], Path], str]  # (the command's JSON, the work dir) -> the headline figure


@dataclass(frozen=True)
class Outcome:
    """What one step gave: `ok`, `FAIL` or `skipped`, the headline figure or the reason, and its wall time."""

    name: str
    status: str
    detail: str
    wall_s: float


# ---- reading each verb's JSON (pure) ----------------------------------------------------------------


def read_doctor(doc: dict[str, Any], _: Path) -> str:
    findings = doc.get("findings", [])
    counts = {s: sum(1 for f in findings if f.get("severity") == s) for s in ("fail", "warn")}
    gpus = next((f.get("evidence") for f in findings if "gpu" in str(f.get("id", "")).lower()), "no GPU finding")
    return f"{counts['fail']} fail, {counts['warn']} warn; {gpus}"[:110]


def read_bench(doc: dict[str, Any], _: Path) -> str:
    if doc.get("device", "").split(":")[0] != "cuda":
        raise ValueError(f"measured on {doc.get('device')!r}, not cuda")
    return (f"{doc['samples_per_s']:,.0f} samples/s ±{doc['ci_rel_halfwidth']:.1%}, "
            f"input-bound {doc.get('input_bound_frac') or 0:.0%}, peak {doc['peak_memory_bytes'] / 2**30:.2f} GiB")


def read_tune(doc: dict[str, Any], _: Path) -> str:
    if doc.get("failed_baseline"):
        raise ValueError(doc["failed_baseline"])
    failed = [f"{t['slot']}: {t['status']}" for t in doc.get("trials", []) if t.get("status") not in ("ok", "running")]
    config = ", ".join(f"{k}={v}" for k, v in (doc.get("best_config") or {}).items()) or "defaults"
    speedup = doc.get("speedup")
    figure = f"{speedup:.2f}x" if speedup is not None else "-"
    return f"{figure} with {config}; {len(doc.get('trials', []))} trials" + (f"; failed: {', '.join(failed)}" if failed else "")


def read_compare(doc: dict[str, Any], _: Path) -> str:
    if doc.get("verdict") == "failed":
        raise ValueError(doc.get("summary", "an arm failed"))
    return f"{doc['summary']} ({doc['mode']})"[:110]


def read_profile(doc: dict[str, Any], _: Path) -> str:
    verdict = (doc.get("verdict") or {}).get("kind", "?")
    idle = next((f.get("evidence") for f in doc.get("findings", []) if f.get("id") == "profile.gpu_idle"), "no GPU-idle finding")
    if doc.get("device", "").split(":")[0] != "cuda":
        raise ValueError(f"profiled on {doc.get('device')!r}, not cuda")
    return f"verdict {verdict}; {idle}"[:110]


def read_monitor(doc: dict[str, Any], workdir: Path) -> str:
    import csv

    with open(workdir / "monitor.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    util_columns = [c for c in (rows[0] if rows else {}) if c.startswith("gpu") and "util" in c]
    if not util_columns:
        raise ValueError(f"the CSV has no GPU utilisation column (NVML not read?); columns: {list(rows[0]) if rows else 'none'}")
    peak = max(float(r[c]) for r in rows for c in util_columns if r[c] not in ("", None))
    if peak <= 0:
        raise ValueError("NVML read 0% GPU utilisation through a matmul loop")
    return f"{len(rows)} samples, peak GPU utilisation {peak:.0f}% ({util_columns[0]}); exit {doc.get('exit_code', '?')}"


# ---- the plan and the run ---------------------------------------------------------------------------


def plan_steps(workdir: Path) -> list[Step]:
    """The commands of the check, in order (pure). Their caps add up to under 9 minutes."""
    steps = [Step("doctor", ("doctor", "--json"), 45, read_doctor)]
    for workload in ("language", "vision"):
        steps.append(Step(f"bench {workload}", ("bench", workload, "--device", "cuda", "--max-time", _BENCH_TIME_S, "--json"),
                          50, read_bench))
    for workload in ("language", "vision"):
        knobs = [arg for knob in _GPU_KNOBS for arg in ("--knob", knob)]
        steps.append(Step(f"tune {workload}", ("tune", workload, "--budget", _TUNE_BUDGET, "--trial-time", _TRIAL_TIME_S,
                                               "--guard-steps", "10", *knobs, "--storage", f"sqlite:///{workdir / 'studies.db'}",
                                               "--study", f"gpu-check-{workload}", "--out", str(workdir / f"{workload}.toml"),
                                               "--json"), 115, read_tune))
    steps.append(Step("profile vision", ("profile", "vision", "--device", "cuda", "--trace", str(workdir / "vision.json.gz"),
                                         "--json"), 60, read_profile))
    steps.append(Step("monitor (NVML)", ("monitor", "--interval", "0.5", "--csv", str(workdir / "monitor.csv"), "--no-live",
                                         "--json", "--", sys.executable, "-c", _MONITOR_LOAD), 30, read_monitor))
    steps.append(Step("compare language", ("compare", "language", "--device", "cuda", "--set", "precision.amp=bf16",
                                           "--max-time", _COMPARE_TIME_S, "--json"), 50, read_compare))
    return steps


def plan_speedup_steps(workdir: Path) -> list[Step]:
    """The speedup part (pure): for each full-size script, a tune, then tuned/default and tuned/expert in turns.
    Its caps add up to under 10 minutes. The defaults' and the expert's configs are written by
    `write_speedup_configs` before it runs; the tuned one by the tune."""
    steps = []
    knobs = [arg for knob in _SPEEDUP_KNOBS for arg in ("--knob", knob)]
    for workload in ("resnet", "gpt"):
        command = ("--", *script_command(workload, "full"))
        tuned = str(workdir / f"{workload}-tuned.toml")
        steps.append(Step(f"tune {workload} (full)", ("tune", "--budget", _SPEEDUP_BUDGET, "--trial-time", "4",
                                                      "--guard-steps", "10", *knobs, "--storage",
                                                      f"sqlite:///{workdir / 'studies.db'}", "--study",
                                                      f"gpu-speedup-{workload}", "--out", tuned, "--json", *command),
                          _SPEEDUP_TUNE_CAP_S, read_tune))
        for against in ("default", "expert"):
            steps.append(Step(f"{workload} tuned/{against}", (
                "compare", "--config", str(workdir / f"{workload}-{against}.toml"), "--config", tuned, "--max-time",
                _SPEEDUP_COMPARE_TIME_S, "--json", *command), _SPEEDUP_COMPARE_CAP_S, speedup_reader(workload)))
    return steps


def write_speedup_configs(workdir: Path, host) -> None:
    """The defaults' config (no knob set) and the expert's, for each workload of the speedup part."""
    for workload in ("resnet", "gpt"):
        write_config(workdir / f"{workload}-default.toml", {})
        write_config(workdir / f"{workload}-expert.toml", expert_config(workload, host))


def speedup_reader(workload: str, peak_flops: Callable[[], float | None] | None = None,
                   flops: Callable[[], float] | None = None) -> Callable[[dict[str, Any], Path], str]:
    """Reads a tuned/... comparison: the ratio B / A with its CI, the tuned arm's samples/s and its MFU."""

    def read(doc: dict[str, Any], _: Path) -> str:
        if doc.get("verdict") == "failed" or doc.get("ratio") is None:
            raise ValueError(doc.get("summary", "an arm failed"))
        rate = doc["b"]["figure"] if doc.get("unit") == "samples/s" else None
        util = mfu(rate, (flops or (lambda: flops_per_sample(workload, "full")))(),
                   (peak_flops or _this_gpu_peak)())
        return (f"{doc['ratio']:.2f}x [{doc['ratio_ci_low']:.2f}, {doc['ratio_ci_high']:.2f}], tuned "
                f"{rate or 0:,.0f} samples/s, MFU {f'{util:.1%}' if util is not None else '- (GPU not in the table)'}")

    return read


def _this_gpu_peak() -> float | None:
    import torch

    return gpu_peak_flops(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None


Runner = Callable[[list[str], float, Path], subprocess.CompletedProcess]


def run_command(argv: list[str], timeout_s: float, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)


def run_step(step: Step, workdir: Path, runner: Runner) -> Outcome:
    """Run one step and read its JSON; every way it can go wrong is a FAIL row with the reason."""
    start = time.monotonic()
    argv = [sys.executable, "-m", "torchpace", *step.args]
    try:
        done = runner(argv, step.cap_s, workdir)
    except subprocess.TimeoutExpired:
        return Outcome(step.name, "FAIL", f"no answer within {step.cap_s:.0f} s", time.monotonic() - start)
    wall_s = time.monotonic() - start
    if done.returncode != 0 and step.name != "doctor":  # doctor exits 1 on a failed finding: that is a figure
        last = (done.stderr.strip().splitlines() or [""])[-1]
        return Outcome(step.name, "FAIL", f"exit {done.returncode}: {last}"[:140], wall_s)
    try:
        return Outcome(step.name, "ok", step.read(json.loads(done.stdout), workdir), wall_s)
    except (ValueError, KeyError, TypeError, OSError, IndexError) as err:  # json.JSONDecodeError is a ValueError
        return Outcome(step.name, "FAIL", f"{type(err).__name__}: {err}"[:140], wall_s)


def run_check(steps: list[Step], workdir: Path, time_box_s: float, runner: Runner = run_command,
              clock: Callable[[], float] = time.monotonic) -> list[Outcome]:
    """Run `steps` in order; a step whose cap would end past the time box is skipped, with the reason."""
    deadline = clock() + time_box_s
    outcomes = []
    for step in steps:
        if clock() + step.cap_s > deadline:
            outcomes.append(Outcome(step.name, "skipped", f"would pass the {time_box_s / 60:g}-minute time box", 0.0))
            continue
        outcomes.append(run_step(step, workdir, runner))
    return outcomes


def render_table(outcomes: list[Outcome]) -> str:
    """One line per step: name, status, seconds, figure or reason (pure)."""
    width = max(len(o.name) for o in outcomes)
    lines = [f"{'step':<{width}}  {'status':<7}  {'s':>5}  figure or reason", "-" * (width + 40)]
    lines += [f"{o.name:<{width}}  {o.status:<7}  {o.wall_s:5.0f}  {o.detail}" for o in outcomes]
    failed = sum(o.status != "ok" for o in outcomes)
    lines.append(f"{len(outcomes) - failed} of {len(outcomes)} steps ok, {sum(o.wall_s for o in outcomes):.0f} s in all")
    return "\n".join(lines)


def cuda_absent_reason() -> str | None:
    """Why this host cannot run the check (None on a CUDA host)."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (f"no CUDA device here: torch {torch.__version__} ({build}) sees no GPU. make gpu-check runs on a CUDA "
            f"host (with a CUDA build of torch: make TORCH_SPEC=... install); nothing was run")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("verbs", "speedup", "all"), default="verbs",
                        help="verbs: every verb once (the --minutes box); speedup: resnet and gpt at full size tuned "
                             "and compared (a 10-minute box); all: both, one box after the other")
    parser.add_argument("--minutes", type=minutes, default=9.0,
                        help="time box of the verbs part, in minutes, above 0 and below 60 (default 9)")
    parser.add_argument("--keep", type=keep_folder, default=None,
                        help="keep the studies, configs, trace and CSV in a new folder DIR/run-N of this run")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, runner: Runner = run_command,
         cuda_absent: Callable[[], str | None] = cuda_absent_reason) -> int:
    return run(parse_args(argv), runner, cuda_absent)


def run(args: argparse.Namespace, runner: Runner = run_command,
        cuda_absent: Callable[[], str | None] = cuda_absent_reason) -> int:
    """The check the arguments ask for: the commands (`--dry-run`), or each step run and the table printed."""
    if args.dry_run:  # the commands with the folder a run would use; nothing is made
        workdir = next_run_folder(args.keep).absolute() if args.keep else Path(tempfile.gettempdir()) / "torchpace-gpu-check-XXXX"
        print("\n".join(f"{s.name}: torchpace {shlex.join(s.args)}  (cap {s.cap_s:.0f} s)".replace("\n", "\\n")
                        for steps, _ in plan_boxes(args, workdir) for s in steps))
        return 0
    reason = cuda_absent()
    if reason:
        print(f"gpu-check: {reason} (exit {EXIT_NO_CUDA}: skipped)", file=sys.stderr)
        return EXIT_NO_CUDA
    try:
        kept = new_run_folder(args.keep).absolute() if args.keep else None
    except OSError as err:
        print(f"gpu-check: --keep {args.keep}: cannot make a folder for this run there ({err.strerror or err}); "
              "nothing was run", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="torchpace-gpu-check-") as tmp:
        workdir = kept or Path(tmp).resolve()
        boxes = plan_boxes(args, workdir)
        if args.part in ("speedup", "all"):
            from torchpace.host import probe_host

            write_speedup_configs(workdir, probe_host())
        outcomes = [o for steps, box_s in boxes for o in run_check(steps, workdir, box_s, runner)]
    print(render_table(outcomes))
    if kept:
        print(f"gpu-check: this run's studies, configs, trace and CSV are in {kept}", file=sys.stderr)
    return 0 if all(o.status == "ok" for o in outcomes) else 1


def plan_boxes(args: argparse.Namespace, workdir: Path) -> list[tuple[list[Step], float]]:
    """The parts `--part` names, each its steps and its time box in seconds (pure)."""
    return ([(plan_steps(workdir), args.minutes * 60)] if args.part in ("verbs", "all") else []) + \
           ([(plan_speedup_steps(workdir), _SPEEDUP_MINUTES * 60)] if args.part in ("speedup", "all") else [])


if __name__ == "__main__":
    sys.exit(main())
