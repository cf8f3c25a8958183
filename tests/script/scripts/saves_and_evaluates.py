"""A training script with a life after its measured steps: it trains STEPS steps, evaluates, checkpoints the whole
model to FOLDER/model.pt, and then trains on (for ever with `--forever`, else STEPS more steps, then exits 0).

Its evaluation logs the weights' norms with `.view(-1)`, as many scripts' weight statistics do: a conv weight in
channels_last memory cannot be viewed so ("view size is not compatible with input tensor's size and stride"), so
under `model.channels_last` the script fails at its evaluation, after every step a trial measures.
`--no-eval` trains for ever and never evaluates nor saves.

usage: saves_and_evaluates.py FOLDER STEPS [--forever | --no-eval]
"""

import sys
from pathlib import Path

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.conv(x).mean((2, 3)))


folder, steps = Path(sys.argv[1]), int(sys.argv[2])
forever, evaluates = "--forever" in sys.argv, "--no-eval" not in sys.argv
torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))


def train(n):
    for _ in range(n):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


train(steps)
while not evaluates:
    train(1)
model.eval()
with torch.no_grad():
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    norms = {name: p.view(-1).norm().item() for name, p in model.named_parameters()}
print(f"eval accuracy {accuracy:.2f}, weight norms {sorted(norms)}", flush=True)
torch.save(model, folder / "model.pt")
model.train()
train(steps)
while forever:
    train(1)
