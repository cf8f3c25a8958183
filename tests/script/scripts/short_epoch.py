"""Fixture: a script whose run is one short epoch of 20 steps, then an evaluation and a checkpoint, then its exit,
as a fine-tuning or smoke-test run of a published script is (`--epochs 1` on a small split).

Its steps take `--step-ms`; from its `--fast-runs`+1-th run on (counted in `--runs-file`), `--slow-ms`: a host that
was quiet while the tune's baseline ran and is busy afterwards, made repeatable.
"""

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--steps-per-epoch", type=int, default=20)
parser.add_argument("--step-ms", type=float, default=100.0)
parser.add_argument("--slow-ms", type=float, default=None)
parser.add_argument("--fast-runs", type=int, default=2)
parser.add_argument("--runs-file", default=None)
parser.add_argument("--eval-s", type=float, default=1.0)
parser.add_argument("--output-dir", default="")
args = parser.parse_args()

step_s = args.step_ms / 1000
if args.runs_file:
    with open(args.runs_file, "a") as runs:
        runs.write("run\n")
    with open(args.runs_file) as runs:
        run = sum(1 for _ in runs)
    if args.slow_ms is not None and run > args.fast_runs:
        step_s = args.slow_ms / 1000

torch.manual_seed(0)
samples = args.batch_size * args.steps_per_epoch
data = TensorDataset(torch.randn(samples, 32), torch.randint(0, 4, (samples,)))
loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(args.epochs):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(step_s)  # the step's compute
    with torch.no_grad():  # evaluation: no step for a while
        time.sleep(args.eval_s)
        print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(args.output_dir, "checkpoint.pth"))
print("done", flush=True)
