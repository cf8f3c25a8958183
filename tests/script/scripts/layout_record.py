"""What `model.channels_last` does in an unmodified script (`torchpace.script.layout`), seen from inside.

argv[1] picks the model: `conv` (a small conv net, trained 4 steps with the layout hook, and again
without it from the same seed, to compare the losses), `linear` (no 2-D convolution) or `ddp` (the conv
net wrapped in DistributedDataParallel in a one-process gloo group, its store the file argv[2], before its first forward). Prints
JSON: what the hook reported, the layouts the forward saw, whether the optimizer's parameters are the
same tensors, and the losses.
"""

import json
import sys

import torch
from torch import nn

from torchpace.script.inprocess import HookReport
from torchpace.script.layout import install_script_layout


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)
        self.seen = []

    def forward(self, images):
        self.seen.append(images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous())
        x = torch.relu(self.conv2(torch.relu(self.conv1(images))))
        return self.head(x.mean(dim=(2, 3)))


def train(model, steps=4):
    torch.manual_seed(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = [id(p) for p in model.parameters()]
    losses = []
    for _ in range(steps):
        images, labels = torch.randn(8, 3, 12, 12), torch.randint(0, 4, (8,))
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    same = before == [id(p) for group in optimizer.param_groups for p in group["params"]]
    return losses, same


kind = sys.argv[1]
report = HookReport()
torch.manual_seed(0)
if kind == "linear":
    model = nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 4))
    install_script_layout(report, "model.channels_last")
    model(torch.randn(2, 12))
    print(json.dumps({"reached": sorted(report.reached), "not_applied": report.not_applied}))
    sys.exit(0)
reference = ConvNet()
model = ConvNet()
model.load_state_dict(reference.state_dict())
eager_losses, _ = train(reference)  # before the hook: every later outermost conv module is converted
if kind == "ddp":
    torch.distributed.init_process_group("gloo", init_method=f"file://{sys.argv[2]}", rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(model)
install_script_layout(report, "model.channels_last")
losses, same = train(model)
inner = model.module if kind == "ddp" else model
weights_cl = [m.weight.is_contiguous(memory_format=torch.channels_last) and not m.weight.is_contiguous()
              for m in (inner.conv1, inner.conv2)]
print(json.dumps({"reached": sorted(report.reached), "not_applied": report.not_applied, "inputs": inner.seen,
                  "weights": weights_cl, "same_parameters": same, "losses": losses, "eager_losses": eager_losses}))
if kind == "ddp":
    torch.distributed.destroy_process_group()
