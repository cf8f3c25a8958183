"""Fixture (g): trains for a few steps only, then exits cleanly (before a measurement can finish)."""

import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
pause_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(steps):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    time.sleep(pause_s)
print("done")
