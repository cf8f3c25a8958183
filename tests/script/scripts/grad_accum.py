"""Fixture (d): gradient accumulation, 4 backward() per optimizer step, batches of 8 from a DataLoader."""

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ACCUMULATE = 4
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1)), batch_size=8, drop_last=True)
model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
stamps = open(sys.argv[1], "a", buffering=1) if len(sys.argv) > 1 else None
for epoch in range(100_000):
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y) / ACCUMULATE
        loss.backward()
        if (i + 1) % ACCUMULATE == 0:
            time.sleep(0.004)
            optimizer.step()
            if stamps:
                stamps.write(f"{time.perf_counter()}\n")
            optimizer.zero_grad()
