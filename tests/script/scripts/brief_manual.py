"""Fixture: a hand-written SGD loop (no torch.optim optimizer) that ends by itself, like pytorch/examples'
regression (a few seconds in all): after argv[1] steps of about argv[2] seconds each, or once argv[3]
seconds have passed since its first step, whichever comes first. The time limit makes how long it runs
measured, whatever the host's speed (a loaded host would stretch a number of steps)."""

import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
pause_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.005
limit_s = float(sys.argv[3]) if len(sys.argv) > 3 else float("inf")
torch.manual_seed(0)
w = torch.zeros(16, 1, requires_grad=True)
true_w = torch.randn(16, 1)
first_step_end = None
for step in range(steps):
    x = torch.randn(32, 16)
    loss = ((x @ w - x @ true_w) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad.zero_()
    time.sleep(pause_s)
    now = time.monotonic()
    first_step_end = first_step_end or now
    if now - first_step_end >= limit_s:
        break
print(f"done after {step + 1} steps: loss {loss.item():.4f}")
