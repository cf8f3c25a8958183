"""Fixture (b): a hand-written SGD loop, no torch.optim optimizer and no DataLoader (`p.data.add_`)."""

import sys
import time

import torch

torch.manual_seed(1)
w = torch.zeros(64, 1, requires_grad=True)
true_w = torch.randn(64, 1)
stamps = open(sys.argv[1], "a", buffering=1) if len(sys.argv) > 1 else None
for step in range(1_000_000):
    x = torch.randn(128, 64)
    y = x @ true_w
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    if stamps:
        stamps.write(f"{time.perf_counter()}\n")
    with torch.no_grad():
        w.data.add_(w.grad, alpha=-0.01)
        w.grad.zero_()
    time.sleep(0.004)
