"""Planted inference workloads for tests/inference (loaded as `tests/inference/inference_planted.py:NAME`)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from torchpace.workload import Workload

FEATURES, HIDDEN, CLASSES, SAMPLES = 64, 256, 10, 512
PLANTED = Path(__file__)


def planted(name: str) -> str:
    """Workload spec of a planted workload in this file."""
    return f"{PLANTED}:{name}"


def _clustered_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs in well-separated clusters, one per class; feature 0 is always exactly zero."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(SAMPLES) % CLASSES
    centres = torch.randn(CLASSES, FEATURES, generator=gen) * 2
    x = centres[labels] + 0.3 * torch.randn(SAMPLES, FEATURES, generator=gen)
    x[:, 0] = 0.0
    return x, labels


def _fitted_mlp(x: torch.Tensor, labels: torch.Tensor) -> nn.Sequential:
    """Linear-ReLU-Linear whose last layer is a least-squares fit to 10 x one-hot targets: wide margins."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    with torch.no_grad():
        hidden = model[1](model[0](x))
        design = torch.cat([hidden, torch.ones(len(x), 1)], dim=1)
        targets = 10.0 * nn.functional.one_hot(labels, CLASSES).float()
        solution = torch.linalg.lstsq(design, targets).solution
        model[2].weight.copy_(solution[:-1].T)
        model[2].bias.copy_(solution[-1])
    return model.eval()


def wide_mlp() -> Workload:
    """A classifier whose Linear layers quantize to int8 with its predictions intact."""
    x, labels = _clustered_data()
    return Workload(model=_fitted_mlp(x, labels), dataset=torch.utils.data.TensorDataset(x, labels), loss=None,
                    batch_size=32, shuffle=False, name="wide_mlp")


def breaks_under_int8() -> Workload:
    """Like `wide_mlp`, plus one huge weight on an input that is always zero: harmless in fp32, but
    per-tensor int8 weights then round every other weight of that layer to zero."""
    workload = wide_mlp()
    with torch.no_grad():
        workload.model[0].weight[0, 0] = 1e4
    workload.name = "breaks_under_int8"
    return workload


class Branchy(nn.Module):
    """Data-dependent control flow: torch.export cannot capture it; a TorchScript trace can (one branch)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().sum() > 0:
            return self.inner(x)
        return self.inner(x) * 0


def branchy() -> Workload:
    workload = wide_mlp()
    workload.model = Branchy(workload.model).eval()
    workload.name = "branchy"
    return workload


def branchy_breaks_under_int8() -> Workload:
    """Both planted failures: int8 breaks accuracy, torch.export fails; TorchScript works."""
    workload = breaks_under_int8()
    workload.model = Branchy(workload.model).eval()
    workload.name = "branchy_breaks_under_int8"
    return workload


def trains() -> Workload:
    """A training workload (it has a loss), for the usage errors of inference-only options."""
    workload = wide_mlp()
    workload.loss = lambda output, batch: nn.functional.cross_entropy(output, batch[1])
    workload.shuffle = True
    return workload
