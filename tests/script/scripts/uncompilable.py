"""Fixture: a model torch.compile cannot compile (a custom operator with no fake-tensor implementation,
as an extension written before torch.compile often is); eagerly it trains. argv[1]: steps (default 100000)."""

import sys

import torch
from torch import nn


@torch.library.custom_op("fixture::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


double.register_autograd(lambda ctx, grad: grad * 2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 2)

    def forward(self, x):
        return self.b(double(self.a(x)))


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 16), torch.randint(0, 2, (32,))
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 100000):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
