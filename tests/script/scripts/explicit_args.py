"""Fixture (c): a script that passes num_workers=0 and pin_memory itself, and fused=False to Adam."""

import json
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(256, 16), torch.randint(0, 2, (256,)))
loader = DataLoader(data, 16, True, num_workers=0, pin_memory=False)
model = nn.Linear(16, 2)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=False)
with open(sys.argv[1], "w") as f:
    json.dump({"num_workers": loader.num_workers, "prefetch_factor": loader.prefetch_factor,
               "pin_memory": loader.pin_memory, "fused": optimizer.defaults.get("fused"),
               "batch_size": loader.batch_size}, f)
for epoch in range(100_000):
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
