"""Fixture: a script that compiles its model itself (`torch.compile(model)`, the eager backend: no C++
build), then trains until the measurement ends it."""

import torch
from torch import nn

model = torch.compile(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)), backend="eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 16), torch.randint(0, 2, (32,))
for _ in range(1_000_000):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
