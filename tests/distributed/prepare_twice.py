"""Run under torchrun by the tests: a script that never touches torch.distributed itself calls
prepare() twice with DDP; prepare joins the job's group once, and the ranks leave it together at exit."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from torchpace.examples.tabular import workload
from torchpace.runtime import prepare

lines = []
for attempt in range(2):
    with prepare(workload(), {"distributed.strategy": "ddp"}) as run:
        loss = run.step(next(iter(run.loader)))
        lines.append(f"attempt {attempt} world {run.world_size} finite {bool(torch.isfinite(loss))}")
lines.append(f"still joined {torch.distributed.is_initialized()}")
(Path(sys.argv[1]) / f"rank{torch.distributed.get_rank()}.txt").write_text("\n".join(lines))
