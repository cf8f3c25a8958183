"""Fixture (a): a plain DataLoader + AdamW loop whose loader does real per-sample work.

Written as a user would, knowing nothing of torchpace. `--stamps FILE` appends one line per optimizer
step (`time.perf_counter()`), so a test can time the loop from outside torchpace's hook; `--report FILE`
writes the DataLoader/optimizer settings the script ends up with, read from the objects themselves.
"""

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    """Each sample costs real work: `work` FFT round trips of a generated signal, after `io_ms` of
    waiting that stands for reading the sample from storage."""

    def __init__(self, n, width, work, io_ms=0.0):
        self.n, self.width, self.work, self.io_s = n, width, work, io_ms / 1000

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.io_s:
            time.sleep(self.io_s)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.width, generator=g)
        for _ in range(self.work):
            x = torch.fft.irfft(torch.fft.rfft(x), n=self.width)
        return x, (x.sum() > 0).long()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--work", type=int, default=20)
    parser.add_argument("--io-ms", type=float, default=0.0)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--stamps", default=None)
    parser.add_argument("--report", default=None)
    args = parser.parse_args()

    loader = DataLoader(Squares(args.samples, 256, args.work, args.io_ms), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"num_workers": loader.num_workers, "prefetch_factor": loader.prefetch_factor,
                       "persistent_workers": loader.persistent_workers, "pin_memory": loader.pin_memory,
                       "foreach": optimizer.defaults.get("foreach"), "fused": optimizer.defaults.get("fused"),
                       "threads": torch.get_num_threads()}, f)
    stamps = open(args.stamps, "a", buffering=1) if args.stamps else None
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if stamps:
                stamps.write(f"{time.perf_counter()}\n")
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
