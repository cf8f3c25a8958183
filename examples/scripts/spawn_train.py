"""A script that starts its own ranks with `torch.multiprocessing.spawn`: an MLP trained with
DistributedDataParallel over gloo (NCCL on GPUs) on random features, `--ranks` processes.

Nothing here knows torchpace: `torchpace bench -- python examples/scripts/spawn_train.py --ranks 2` measures
every rank it spawns as one job. With `--stamps PREFIX` each rank appends one timestamp per optimizer step
to PREFIX.rankR (the script's own clock).
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(rank, world, port, args):
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    features = torch.randn(16384, 64)
    labels = (features[:, :10].argmax(dim=1) + (features[:, 10] > 1).long()) % 10
    data = TensorDataset(features, labels)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                                                  nn.Linear(256, 10)).to(device), device_ids=[rank] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stamps = open(f"{args.stamps}.rank{rank}", "a", buffering=1) if args.stamps else None
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if stamps:
                stamps.write(f"{time.perf_counter()}\n")
    dist.destroy_process_group()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--stamps", default=None)
    args = parser.parse_args()
    mp.spawn(train, args=(args.ranks, free_port(), args), nprocs=args.ranks, join=True)
    print("all ranks done", flush=True)


if __name__ == "__main__":
    main()
