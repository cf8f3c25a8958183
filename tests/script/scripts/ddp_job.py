"""Fixture: a small unmodified DDP training script over gloo, its ranks started by a launcher (torchrun) or by
itself (`--spawn N`: torch.multiprocessing.spawn). Each rank appends one timestamp per optimizer step to
STAMPS.rankR (the script's own clock) and trains STEPS steps.

`--fail rank:step:how` makes one rank fail at a step: `raise` (a Python exception), `kill` (SIGKILL itself: no
traceback), `hang` (sleeps for ever: its peers wait in their collective), `slow` (each of its steps sleeps 20 ms
longer: a straggler). `--no-group` trains without torch.distributed (each rank alone).
"""

import argparse
import os
import signal
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(rank, world, port, args):
    if not args.no_group:
        if port:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        else:
            dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0) if not args.no_group else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None, drop_last=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    if not args.no_group:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    fail_rank, fail_step, how = (args.fail.split(":") + ["", "", ""])[:3] if args.fail else ("-1", "-1", "")
    fails = rank == int(fail_rank)
    stamps = open(f"{args.stamps}.rank{rank}", "a", buffering=1) if args.stamps else None
    step, epoch = 0, 0
    while step < args.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            if fails and step == int(fail_step):
                if how == "raise":
                    raise RuntimeError(f"rank {rank} broke on purpose at step {step}")
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if how == "hang":
                    time.sleep(3600)
            if fails and how == "slow" and step >= int(fail_step):
                time.sleep(0.02)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.sleep)
            step += 1
            if stamps:
                stamps.write(f"{time.perf_counter()}\n")
            if step >= args.steps:
                break
        epoch += 1
    if not args.no_group:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sleep", type=float, default=0.002, help="seconds each step also waits (a steady step)")
    parser.add_argument("--stamps", default=None)
    parser.add_argument("--fail", default=None)
    parser.add_argument("--spawn", type=int, default=0)
    parser.add_argument("--no-group", action="store_true")
    args = parser.parse_args()
    if args.spawn:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        mp.spawn(train, args=(args.spawn, port, args), nprocs=args.spawn)
    else:
        train(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), None, args)


if __name__ == "__main__":
    main()
