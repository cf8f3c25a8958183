"""Fixture: trains in a `TemporaryDirectory` (as the HF Trainer example makes one) inside `try/finally`, with
an `atexit` handler and a temporary folder held by an object (removed by its finalizer at exit); writes each
folder's path to argv[1] and what its clean-up ran to argv[2]. argv[3]: steps, then "stall" to stop
stepping (a hung read) or "loop" to go on until ended."""

import atexit
import sys
import tempfile
import time
from pathlib import Path

import torch

paths, ran, steps, after = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
held = tempfile.TemporaryDirectory(prefix="held-")  # no `with`: its finalizer removes it at exit
atexit.register(lambda: ran.open("a").write("atexit\n"))
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
with tempfile.TemporaryDirectory(prefix="work-") as work:
    paths.write_text(f"{work}\n{held.name}\n")
    try:
        for step in range(10**9 if after == "loop" else steps):
            optimizer.zero_grad()
            model(torch.randn(16, 8)).pow(2).mean().backward()
            optimizer.step()
        time.sleep(10**6)
    finally:
        ran.open("a").write("finally\n")
