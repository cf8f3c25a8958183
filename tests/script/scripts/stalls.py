"""Fixture: trains argv[1] steps, then stops stepping without ending (a deadlock, a hung read)."""

import sys
import time

import torch

model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(int(sys.argv[1])):
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
time.sleep(10**6)
