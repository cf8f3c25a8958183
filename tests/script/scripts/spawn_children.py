"""Fixture (h): a loop whose DataLoader workers are spawned (fresh interpreters, as on macOS or with
`multiprocessing_context="spawn"`) and which runs a Python subprocess that imports torch.

Each of those processes writes to REPORT whether torchpace's measurement hook was installed in it
(`torchpace.script.hook` in `sys.modules` after `import torch`): one line `PID role hooked`.
"""

import os
import subprocess
import sys

import torch
from torch.utils.data import DataLoader, Dataset

REPORT = sys.argv[1]


def record(role: str) -> None:
    with open(REPORT, "a") as f:
        f.write(f"{os.getpid()} {role} {'torchpace.script.hook' in sys.modules}\n")


class Noise(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        return torch.randn(8)


def worker_init(_worker_id):
    record("worker")


if __name__ == "__main__":
    record("main")
    subprocess.run([sys.executable, "-c", "import os, sys, torch; open(sys.argv[1], 'a').write("
                    "f\"{os.getpid()} subprocess {'torchpace.script.hook' in sys.modules}\\n\")", REPORT], check=True)
    loader = DataLoader(Noise(), batch_size=16, num_workers=1, multiprocessing_context="spawn",
                        persistent_workers=True, worker_init_fn=worker_init)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in loader:
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
