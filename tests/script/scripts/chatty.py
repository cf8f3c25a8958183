"""Fixture: a plain loop that prints on both streams, as training scripts do (a banner on stderr, one
line per step on stdout, flushed), and trains until the measurement ends it."""

import sys
import time

import torch

print("chatty: starting (stderr)", file=sys.stderr, flush=True)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1_000_000):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    print(f"chatty: step {step} (stdout)", flush=True)
    time.sleep(0.002)
