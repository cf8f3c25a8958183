"""Fixture: a conv net whose forward flattens with `.view()`, which needs a contiguous tensor: under
channels_last the convolution's output is not, and torch raises (the model's own failure, not torchpace's)."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
head = nn.Linear(4 * 8 * 8, 2)
optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.01)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
for _ in range(steps):
    features = model(torch.randn(16, 3, 8, 8))
    loss = nn.functional.cross_entropy(head(features.view(16, -1)), torch.randint(0, 2, (16,)))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
