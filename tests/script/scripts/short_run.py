"""Fixture (g): trains for a few steps only, then exits cleanly (before a measurement can finish).

With `pause_s` longer than the bench's window (`--max-time 8` sizes windows of 0.2 s), every window
is one step, so how far the measurement gets depends on the step count alone, not on the host's
speed: the meter starts after step 1, sizes its window from two single steps, warms up over two
windows, and needs six measured windows to stop on its CI. Ten steps leave it at most five measured
windows (the script always ends first) and at least two when the steps are as steady as a sleep.
"""

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
