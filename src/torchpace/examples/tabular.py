"""`tabular`: an MLP regressor on in-memory features. Small steps: overhead-bound (batch size,
compile and threads matter)."""

from __future__ import annotations

import torch
from torch import nn

from torchpace.workload import Workload

N_ROWS = 16384
N_FEATURES = 64
N_CLASSES = 8


def make_tabular_data(n_rows: int = N_ROWS, seed: int = 0) -> torch.utils.data.TensorDataset:
    """Features from a fixed Gaussian; labels from a fixed random 2-layer teacher (learnable)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, N_FEATURES, generator=gen)
    teacher = torch.randn(N_FEATURES, 32, generator=gen), torch.randn(32, N_CLASSES, generator=gen)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def make_mlp(hidden: int = 256, depth: int = 3) -> nn.Module:
    layers: list[nn.Module] = []
    width = N_FEATURES
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, N_CLASSES))
    return nn.Sequential(*layers)


def _cross_entropy(output: torch.Tensor, batch) -> torch.Tensor:
    return nn.functional.cross_entropy(output, batch[1])


def workload() -> Workload:
    torch.manual_seed(0)
    return Workload(
        model=make_mlp(),
        dataset=make_tabular_data(),
        loss=_cross_entropy,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        batch_size=256,
        clip_grad_norm=1.0,
        name="tabular",
    )
