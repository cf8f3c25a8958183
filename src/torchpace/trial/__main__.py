"""Child side of a trial: `python -m torchpace.trial SPEC.json RESULT.json`.

Runs the spec's guard steps (if any) and bench in this fresh process and writes RESULT.json. Anything
the workload raises is a recorded result (crash / oom / nonfinite / invalid), never an unhandled exit,
except a hard crash (segfault, SIGKILL), which the parent classifies from the exit status.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
import traceback
from pathlib import Path

from torchpace.errors import UsageError, UserCodeError
from torchpace.files import write_atomic
from torchpace.knobs.distributed import data_parallel
from torchpace.measure.gate import Gate
from torchpace.process import owner_pid
from torchpace.protocol import (CRASH, GUARD, INVALID, NONFINITE, OK, OOM, STACK_DUMP_SIGNAL, TrialResult, TrialSpec,
                                is_nonfinite)
from torchpace.trial.ranks import enter_rank, record_rank_failure
from torchpace.workload import load_workload


def run_spec(spec: TrialSpec, report_to: Path | None = None) -> TrialResult:
    """Run one trial in this process and return its result (never raises for workload errors).

    Args:
        report_to: where a paired comparison's arm writes the result of each comparison it is kept
            through (`torchpace.measure.gate`: the parent's `report`); the final result is returned.
    """
    import torch

    from torchpace.inference.accuracy import AccuracyRejected
    from torchpace.measure.bench import BenchOptions
    from torchpace.trial.bench import run_bench

    start = time.perf_counter()
    sys.path[:0] = spec.sys_path
    try:
        guard_losses: list[float] = []
        guard_metric = None
        if spec.guard_steps:
            from torchpace.trial.guard_steps import GUARD_SEED, run_guard_steps

            torch.manual_seed(GUARD_SEED)  # same initial weights for every trial, even unseeded workloads
            guard_losses, guard_metric = run_guard_steps(load_workload(spec.workload), spec.config, spec.guard_steps, device=spec.device)
            if is_nonfinite(guard_losses):
                return TrialResult(NONFINITE, guard_losses=guard_losses, error="loss became NaN/Inf in the guard steps",
                                   wall_time_s=time.perf_counter() - start)
        options = BenchOptions(max_time_s=spec.max_time_s, compute_only=spec.compute_only, warmup_s=spec.warmup_s,
                               turns=spec.objective)  # in a comparison, the turns measure the objective's figure
        workload = load_workload(spec.workload)
        gate = Gate.open(spec.gate)

        def measured(bench) -> TrialResult:
            status = NONFINITE if is_nonfinite(bench.loss_values) else OK
            error = "loss became NaN/Inf while measuring" if status == NONFINITE else ""
            verdict = _profile_verdict(spec) if spec.profile and status == OK else None
            return TrialResult(status, bench, guard_losses, guard_metric, error, wall_time_s=time.perf_counter() - start,
                               verdict=verdict)

        on_report = (lambda bench: _write(measured(bench), report_to)) if gate is not None and report_to else None
        bench = run_bench(workload, spec.config, options, device=spec.device, accuracy=_accuracy_guard(spec, workload),
                          own_root_pid=owner_pid(),  # the tuner (or bench) that started this trial, past its keeper
                          clock=gate.clock if gate else time.perf_counter, gate=gate, on_report=on_report)
        return measured(bench)
    except AccuracyRejected as err:
        return TrialResult(GUARD, accuracy=err.report, error=str(err), wall_time_s=time.perf_counter() - start)
    except UsageError as err:
        return TrialResult(INVALID, error=str(err), wall_time_s=time.perf_counter() - start)
    except (UserCodeError, torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
        status = OOM if _is_oom(err) else CRASH
        detail = err.user_traceback if isinstance(err, UserCodeError) else traceback.format_exc()
        return TrialResult(status, error=f"{err}\n{detail[-4000:]}", wall_time_s=time.perf_counter() - start)


def _accuracy_guard(spec: TrialSpec, workload):
    """The accuracy guard of an inference trial: the fp32 eager reference of `workload`, captured
    before `prepare()` changes its model (None for training workloads or without accuracy batches)."""
    if workload.is_training or spec.accuracy_batches <= 0:
        return None
    from torchpace.inference.accuracy import AccuracyGuard, AccuracyTolerance

    tolerance = AccuracyTolerance(spec.accuracy_rtol, spec.accuracy_atol, spec.min_top1_agreement)
    return AccuracyGuard.capture(workload, spec.accuracy_batches, tolerance, enforce=spec.accuracy_enforce)


def _profile_verdict(spec: TrialSpec) -> str:
    """The bottleneck verdict of a short profile under the spec's config (e.g. `input-bound`)."""
    from torchpace.profile.capture import CaptureOptions
    from torchpace.profile.run import profile_workload

    options = CaptureOptions(steps=3, python_steps=0, profile_memory=False)
    return profile_workload(spec.workload, spec.config, options, device=spec.device).verdict.kind.value


def _is_oom(err: BaseException) -> bool:
    import torch

    chain = [err, err.__cause__]
    return any(isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(e).lower() for e in chain if e)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m torchpace.trial SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec, result_path = TrialSpec.load(Path(argv[0])), Path(argv[1])
    # at the cap the parent asks for every thread's stack (where a stuck trial was, in its stderr tail)
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    from torchpace.engine.distributed import RankEnv

    ranks = RankEnv.from_env()
    if not ranks.under_torchrun:
        _write(run_spec(spec, report_to=result_path), result_path)
        return 0

    enter_rank(result_path, ranks.rank)
    result = _run_rank(spec)
    if result.status in (CRASH, OOM):  # raised mid-step: the other ranks may wait on this one in a collective
        record_rank_failure(result, result_path, ranks.rank)
    end_rank(result, result_path if ranks.rank == 0 else None)


def _run_rank(spec: TrialSpec) -> TrialResult:
    """`run_spec` in one rank of a torchrun job: the process group is joined once, for the guard and
    the bench (each `prepare()` reuses it)."""
    import torch

    from torchpace.engine.distributed import setup_distributed

    parallel = data_parallel(spec.config)
    try:
        if parallel.enabled:
            setup_distributed(parallel.strategy, parallel.backend, torch.device(spec.device) if spec.device else None,
                              torch.cuda.is_available())
    except RuntimeError as err:
        return TrialResult(CRASH, error=f"joining the process group failed: {err}")
    return run_spec(spec)


def end_rank(result: TrialResult, result_path: Path | None) -> None:
    """Wait for every rank, write the result (rank 0), and end at once: tearing the group down at
    interpreter exit can abort ("terminate called without an active exception") when a peer left first."""
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    if result_path is not None:
        _write(result, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _write(result: TrialResult, path: Path) -> None:
    write_atomic(path, json.dumps(result.to_dict()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
