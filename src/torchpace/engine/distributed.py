"""Data-parallel training under torchrun: process group, model wrapping, samplers, collective figures.

`prepare()` calls `setup_distributed` when the config's `distributed.strategy` is ddp or fsdp (what
the knobs ask for arrives as `torchpace.knobs.distributed.DataParallel`, defaults filled in): it joins
(or starts) the process group, picks the rank's device, and wraps the model; the loader then reads a
`DistributedSampler` shard. Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK in the environment) the
group is the job's; elsewhere a one-process group on loopback, so a distributed config still runs.
Either is joined once for the process (a later `prepare()` reuses it, and so does a group the script
initialised itself); a torchrun group is left at exit by every rank together.

Measuring across ranks (`CollectiveClock`, `Dist.sum` / `Dist.max`) uses a separate gloo group, so it
works beside NCCL and costs one tiny CPU all-reduce per call. Every rank calls them at the same points
of the same code, so every rank takes the same decisions from the same figures.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch

from torchpace.engine.checkpointing import find_block_container


BACKENDS = ("auto", "gloo", "nccl")
_TIMEOUT = datetime.timedelta(minutes=10)  # a collective that waits longer than this is a hang
_EXIT_WAIT = datetime.timedelta(seconds=30)  # how long a rank leaving at exit waits for the others


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in a torchrun job (all zeros / ones outside one)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def under_torchrun(self) -> bool:
        return self.world_size > 1 or self.rank > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "RankEnv":
        env = os.environ if env is None else env
        if "RANK" not in env or "WORLD_SIZE" not in env:
            return cls()
        world = int(env["WORLD_SIZE"])
        return cls(int(env["RANK"]), world, int(env.get("LOCAL_RANK", env["RANK"])), int(env.get("LOCAL_WORLD_SIZE", world)))


def fsdp_flavour() -> str | None:
    """'fsdp2' (`fully_shard`), 'fsdp1' (FullyShardedDataParallel), or None where torch has neither."""
    if not torch.distributed.is_available():
        return None
    if _fully_shard() is not None:
        return "fsdp2"
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: F401
    except ImportError:
        return None
    return "fsdp1"


def _fully_shard() -> Callable | None:
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # torch 2.4 / 2.5
        except ImportError:
            return None
    return fully_shard


def choose_backend(asked: str, device: torch.device) -> str:
    """The process group backend: nccl for CUDA devices, gloo otherwise, unless one was asked for."""
    if asked != "auto":
        return asked
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass
class Dist:
    """The process group a prepared run trains in, and cross-rank reductions over a gloo side group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    strategy: str
    _side: Any = field(default=None, repr=False)

    def _reduce(self, value: float, op) -> float:
        if self.world_size == 1:
            return float(value)
        tensor = torch.tensor([float(value)], dtype=torch.float64)
        torch.distributed.all_reduce(tensor, op=op, group=self._side)
        return float(tensor.item())

    def sum(self, value: float) -> float:
        """`value` summed over every rank."""
        return self._reduce(value, torch.distributed.ReduceOp.SUM)

    def max(self, value: float) -> float:
        """The largest `value` of any rank."""
        return self._reduce(value, torch.distributed.ReduceOp.MAX)

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier(group=self._side)


class CollectiveClock:
    """A clock every rank reads alike: each call is an all-reduce of the ranks' elapsed time (the max).

    Times start at a barrier, so a reading is when the last rank got there: a window timed with it
    runs from barrier to barrier, and its samples/s is the whole job's. Each call is a collective, so
    all ranks must call it at the same points (the measuring code does: its decisions depend only on
    the readings).
    """

    def __init__(self, clock: Callable[[], float], dist: Dist):
        self._clock, self._dist = clock, dist
        dist.barrier()
        self._origin = clock()

    def __call__(self) -> float:
        return self._dist.max(self._clock() - self._origin)


def setup_distributed(strategy: str, backend: str, device: torch.device | None,
                      has_cuda: bool) -> tuple[Dist, torch.device]:
    """Join torchrun's process group (or start a one-process group) and pick this rank's device.

    Args:
        strategy, backend: the config's (`torchpace.knobs.distributed.DataParallel`): ddp or fsdp;
            auto, gloo or nccl.
        device: the device asked for, or None for this rank's default (cuda:LOCAL_RANK when CUDA).
    """
    ranks = RankEnv.from_env()
    if device is None:
        device = torch.device("cuda", ranks.local_rank) if has_cuda else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = choose_backend(backend, device)
    if not torch.distributed.is_initialized():
        if ranks.under_torchrun:  # joined for the rest of the process: re-joining torchrun's store after
            torch.distributed.init_process_group(backend, timeout=_TIMEOUT)  # leaving it can hang
            atexit.register(_leave_at_exit)
        else:  # a one-process group on loopback, so a distributed config runs without torchrun too; kept for
            # the process like torchrun's: destroying it while a DDP wrapper still refers to it can hang
            # that wrapper's destructor (a gloo worker thread that never joins)
            torch.distributed.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                                                 world_size=1, timeout=_TIMEOUT)
    side = _side_group()
    dist = Dist(torch.distributed.get_rank(), torch.distributed.get_world_size(), ranks.local_rank,
                torch.distributed.get_backend(), strategy, side)
    return dist, device


_SIDE_GROUPS: dict[int, Any] = {}  # the gloo group for measuring, per joined group (it lasts the process)


def _side_group() -> Any:
    """None under gloo (the group itself serves); else a gloo group over the same ranks, made once."""
    if torch.distributed.get_backend() == "gloo":
        return None
    key = id(torch.distributed.group.WORLD)
    if key not in _SIDE_GROUPS:
        _SIDE_GROUPS[key] = torch.distributed.new_group(backend="gloo")  # a collective: every rank makes it here
    return _SIDE_GROUPS[key]


def _leave_at_exit() -> None:
    """Leave torchrun's group at interpreter exit, every rank together: a rank whose gloo connections
    are torn down by a peer that exited first can abort ("terminate called without an active exception").

    A rank dying of an exception leaves at once (torchrun then stops the others); a rank whose peers do
    not arrive within `_EXIT_WAIT` leaves without them.
    """
    if not torch.distributed.is_initialized() or getattr(sys, "last_value", None) is not None:
        return
    try:
        if torch.distributed.get_backend() == "gloo":
            torch.distributed.monitored_barrier(timeout=_EXIT_WAIT)
        torch.distributed.destroy_process_group()
    except RuntimeError:
        pass  # a peer is gone: nothing to leave together


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wrap_model(model: torch.nn.Module, options: Mapping[str, Any], dist: Dist, device: torch.device) -> torch.nn.Module:
    """The model wrapped for `dist.strategy`: DistributedDataParallel, or FSDP (fully_shard on each
    repeated block and the root; FullyShardedDataParallel where torch has no fully_shard), with the
    wrapper's keyword `options` (`torchpace.knobs.distributed.DataParallel.wrapper_options`)."""
    if dist.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       **options)
    reshard = bool(options["reshard_after_forward"])
    fully_shard = _fully_shard()
    if fully_shard is None:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        strategy = ShardingStrategy.FULL_SHARD if reshard else ShardingStrategy.SHARD_GRAD_OP
        return FullyShardedDataParallel(model, sharding_strategy=strategy,
                                        device_id=device if device.type == "cuda" else None)
    blocks = find_block_container(model)
    for block in blocks if blocks is not None else ():
        if any(True for _ in block.parameters()):
            fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    return model


def distributed_sampler(dataset: Any, dist: Dist, shuffle: bool, seed: int):
    """This rank's shard of a map-style dataset (equal sizes: the tail that does not divide is dropped);
    None for an IterableDataset, which shards itself."""
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    from torch.utils.data.distributed import DistributedSampler

    return DistributedSampler(dataset, num_replicas=dist.world_size, rank=dist.rank, shuffle=shuffle, seed=seed, drop_last=True)


class RankSliceBatchSampler(torch.utils.data.Sampler):
    """Each batch of `batches`, cut into `world_size` near-equal slices; yields this rank's slice.

    Over all ranks, step k then trains on exactly the global batch k a single process would (the
    convergence guard compares strategies this way, at equal global batch).
    """

    def __init__(self, batches, rank: int, world_size: int):
        self.batches, self.rank, self.world_size = batches, rank, world_size

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            yield list(_slice(list(batch), self.rank, self.world_size))

    def __len__(self) -> int:
        return len(self.batches)


def _slice(items: list, rank: int, world_size: int) -> list:
    base, extra = divmod(len(items), world_size)
    start = rank * base + min(rank, extra)
    return items[start:start + base + (1 if rank < extra else 0)]


def global_batch_loader(loader: torch.utils.data.DataLoader, batch_size: int, dist: Dist) -> torch.utils.data.DataLoader:
    """A loader whose batches, over all ranks, are the global batches of a one-process loader of
    `batch_size` built like `loader` (same dataset, seeded order, collate and worker settings)."""
    generator = torch.Generator().manual_seed(loader.generator.initial_seed()) if loader.generator is not None else None
    dataset = loader.dataset
    shuffle = isinstance(loader.sampler, torch.utils.data.distributed.DistributedSampler) and loader.sampler.shuffle
    sampler = (torch.utils.data.RandomSampler(dataset, generator=generator) if shuffle
               else torch.utils.data.SequentialSampler(dataset))
    batches = torch.utils.data.BatchSampler(sampler, batch_size, drop_last=True)
    workers = loader.num_workers
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=RankSliceBatchSampler(batches, dist.rank, dist.world_size), collate_fn=loader.collate_fn,
        num_workers=workers, pin_memory=loader.pin_memory, generator=generator,
        prefetch_factor=loader.prefetch_factor if workers else None, persistent_workers=loader.persistent_workers)


def global_mean(local_mean: torch.Tensor, local_count: int, dist: Dist) -> float:
    """The mean over the global batch of per-rank means over `local_count` samples each."""
    total = dist.sum(float(local_count))
    return dist.sum(float(local_mean) * local_count) / total
