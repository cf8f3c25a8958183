"""The `tabular` training step in a plain loop, no torchpace in it (run by `bench_compare.py --plain-loop`).

`python plain_loop.py THREADS SECONDS` sets torch's intra-op threads, warms up 50 steps, then steps for
SECONDS and prints one JSON line: steps/s over each quarter second. It shows what the step itself does
on a busy host, apart from any way of measuring it or of taking turns."""

from __future__ import annotations

import json
import sys
import time

import torch

from torchpace.examples.tabular import make_mlp, make_tabular_data


def main(threads: int, seconds: float) -> None:
    torch.set_num_threads(threads)
    x, y = (t[:256] for t in make_tabular_data().tensors)  # one batch of the workload's size
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    for _ in range(50):
        step()
    rates, steps, chunk_start = [], 0, time.perf_counter()
    end = chunk_start + seconds
    while (now := time.perf_counter()) < end:
        if now - chunk_start >= 0.25:
            rates.append(steps / (now - chunk_start))
            steps, chunk_start = 0, now
        step()
        steps += 1
    print(json.dumps({"threads": threads, "rates": rates}))


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
