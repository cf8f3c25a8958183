"""Fixture: sets its own intra-op thread count (torch.set_num_threads(2)), then trains; at its first
step it writes the count it runs with to argv[1]."""

import sys

import torch

torch.set_num_threads(2)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10**9):
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    if step == 0:
        with open(sys.argv[1], "w") as f:
            f.write(str(torch.get_num_threads()))
