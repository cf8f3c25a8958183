"""A plain DistributedDataParallel script, started by a launcher: a small decoder-only transformer trained
as a language model on random tokens, each rank reading its `DistributedSampler` shard.

    torchrun --nproc-per-node 2 examples/scripts/ddp_train.py
    python -m torch.distributed.run --nproc-per-node 2 examples/scripts/ddp_train.py

Nothing here knows torchpace: measure the whole job with `torchpace bench -- torchrun --nproc-per-node 2
examples/scripts/ddp_train.py`, tune it with `torchpace tune -- torchrun ...`, run the tuned config with
`torchpace launch --config torchpace.toml -- torchrun ...`. The backend is NCCL on GPUs, gloo on a CPU.
The script's own clock: every rank prints its steps/s at the end, and rank 0 the job's samples/s (every
rank's samples per wall second); with `--stamps PREFIX` each rank appends one timestamp per optimizer step
to PREFIX.rankR, so the figures torchpace reports can be checked against the script's own.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class RandomTokens(Dataset):
    """Fixed random token sequences: input and next-token target."""

    def __init__(self, count, length, vocab):
        self.tokens = torch.randint(0, vocab, (count, length + 1), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i, :-1], self.tokens[i, 1:]


class TinyLM(nn.Module):
    """Token embedding, a few causal transformer layers, a vocabulary head."""

    def __init__(self, vocab, width, layers, heads, length):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(length, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        return self.head(self.blocks(x, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100000, help="optimizer steps (the job ends after them)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per rank per step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--stamps", default=None, help="each rank appends one timestamp per optimizer step to STAMPS.rankR")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    vocab = 2048
    data = RandomTokens(8192, args.seq_len, vocab)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers, drop_last=True)
    model = DistributedDataParallel(TinyLM(vocab, args.width, args.layers, 4, args.seq_len).to(device),
                                    device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    stamps = open(f"{args.stamps}.rank{rank}", "a", buffering=1) if args.stamps else None
    step, times, epoch = 0, [], 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for tokens, targets in loader:
            tokens, targets = tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            now = time.perf_counter()
            times.append(now)
            if stamps:
                stamps.write(f"{now}\n")
            if step >= args.steps:
                break
        epoch += 1
    if len(times) > 2:  # the script's own clock, from its second step
        rate = (len(times) - 1) / (times[-1] - times[0])
        print(f"rank {rank}: {rate:.2f} steps/s ({rate * args.batch_size:.1f} samples/s of its own)", flush=True)
        if rank == 0:
            print(f"job: {rate * args.batch_size * world:.1f} samples/s over {world} rank(s) (script clock)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
