"""Run under torchrun by the distributed tests: one step of DDP and of FSDP on `tabular`, then a short
bench. Each rank writes what it saw to OUT/rank{R}.json (gradients as full tensors, in a .pt file)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from torchpace.examples.tabular import workload
from torchpace.measure.bench import BenchOptions
from torchpace.measure.memory import read_peak_memory
from torchpace.runtime import prepare
from torchpace.trial.bench import run_bench


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A gradient as one plain tensor (FSDP2 keeps this rank's shard in a DTensor)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def one_step(strategy: str) -> dict:
    with prepare(workload(), {"distributed.strategy": strategy}) as run:
        batch = next(iter(run.loader))
        indices = list(run.loader.sampler)[: run.workload.batch_size]
        run.step(batch)
        grads = [full(p.grad).detach().clone() for p in run.model.parameters()]
        return {"indices": indices, "grads": grads, "world_size": run.world_size, "backend": run.dist.backend,
                "model": type(run.model).__name__}


def main(out: Path) -> None:
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    report = {}
    for strategy in ("ddp", "fsdp"):
        seen = one_step(strategy)
        torch.save(seen.pop("grads"), out / f"grads-{strategy}-rank{rank}.pt")
        report[strategy] = seen
    result = run_bench(workload(), {"distributed.strategy": "ddp"}, BenchOptions(max_time_s=3.0, compute_only=False))
    report["bench"] = result.to_dict()
    report["local_peak_bytes"] = read_peak_memory(torch.device("cpu"))[0]
    report["still_initialized"] = torch.distributed.is_initialized()  # prepare() must not leave a group it joined
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    torch.distributed.barrier()  # leave together, and at once, as a trial's rank does (`trial.__main__.end_rank`):
    sys.stdout.flush()  # tearing gloo down at exit, even after destroy_process_group(), aborted a rank now
    sys.stderr.flush()  # and then ("terminate called without an active exception") after both had written
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
