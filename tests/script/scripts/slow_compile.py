"""Fixture: a model whose first compile takes longer than the stall watchdog's floor of 30 s, in a controlled way.

A ResNet-18 takes about a minute to compile on a 2-core CPU host; to keep the suite fast, this script stands
for such a model with a small one whose compile is made slow: every torch.compile in its process (the one
`compile.mode` makes after the first backward() included) compiles with a backend that sleeps argv[1] seconds
per graph before returning the graph to run eagerly. argv[2]: steps (default 100000).
"""

import functools
import sys
import time

import torch
from torch import nn

COMPILE_S = float(sys.argv[1]) if len(sys.argv) > 1 else 35.0
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000


def slow_backend(graph, example_inputs):
    time.sleep(COMPILE_S)  # the compiler at work
    return graph.forward


torch.compile = functools.partial(torch.compile, backend=slow_backend)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 16), torch.randint(0, 2, (32,))
for step in range(STEPS):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    time.sleep(0.005)
print("done", flush=True)
