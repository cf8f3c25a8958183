"""Data-stage knobs: DataLoader workers, pinned memory, prefetching, persistent workers."""

from __future__ import annotations

from torchpace.knobs.base import IntKnob, Knob, Point, Reach


def _is_iterable_dataset(workload) -> bool:
    import torch.utils.data

    return isinstance(workload.dataset, torch.utils.data.IterableDataset)


class NumWorkersKnob(IntKnob):
    name = "data.num_workers"
    script_reach = Reach.LOADER
    stage = "data"
    shares_cores = True
    point = Point.LOADER
    loader_argument = "num_workers"
    default = 0
    help = "DataLoader worker processes (0 loads in the training process)."
    per_core = 4  # decoding workers wait on I/O, so a few per core can pay; beyond that they only cost memory

    def host_limit(self, host):
        cores = max(1, host.usable_cores)
        return self.per_core * cores, f"{self.per_core} workers per usable core, {cores} usable core(s)"

    def candidates(self, host, workload):
        own = self.default_for(workload)
        counts = [0, 1, 2, 4, 8, 16]
        return [own] + [c for c in counts if c != own and c <= max(2, host.usable_cores)]

    def companions(self, value):
        # no workers: the options of workers back at their defaults (a workload's own, or a script's own
        # persistent workers, cannot go with none)
        return {PrefetchFactorKnob.name: PrefetchFactorKnob.default,
                PersistentWorkersKnob.name: PersistentWorkersKnob.default} if value == 0 else {}

    def value_applies(self, value, host, workload):
        if value and _is_iterable_dataset(workload) and not getattr(workload.dataset, "shards_across_workers", False):
            return ("an IterableDataset must shard itself across workers (see torch.utils.data.get_worker_info) "
                    "and say so with a class attribute shards_across_workers = True")
        return None

    def apply(self, value, target, ctx):
        target["num_workers"] = int(value)
        if not value:  # without workers torch refuses the worker options (a script's own --persistent-workers)
            if target.get("prefetch_factor") is not None:
                target["prefetch_factor"] = None
            if target.get("persistent_workers"):
                target["persistent_workers"] = False
        return target

    def script_value(self, arguments):
        return int(arguments.get("num_workers") or 0)


class PinMemoryKnob(Knob):
    name = "data.pin_memory"
    script_reach = Reach.LOADER
    stage = "data"
    point = Point.LOADER
    loader_argument = "pin_memory"
    default = False
    choices = (False, True)
    help = "page-locked host batches, copied to the GPU with non_blocking=True."

    def applies(self, host, workload):
        if not host.cuda_available:
            return "pinned memory only speeds host-to-GPU copies; no CUDA device here"
        return None

    def apply(self, value, target, ctx):
        target["pin_memory"] = bool(value)
        return target

    def script_value(self, arguments):
        return bool(arguments.get("pin_memory", False))

    def configure_step(self, value, options, ctx):
        options.non_blocking = bool(value) and ctx.device.type == "cuda"  # a pinned batch's copy need not wait


class _WorkerOptionKnob(Knob):
    """A DataLoader option that only means something with worker processes."""

    def conflicts(self, values):
        if values.get(self.name, self.default) != self.default and not values.get("data.num_workers", 0):
            return f"{self.name} needs data.num_workers > 0"
        return None


class PrefetchFactorKnob(_WorkerOptionKnob, IntKnob):
    name = "data.prefetch_factor"
    script_reach = Reach.LOADER
    stage = "data"
    point = Point.LOADER
    loader_argument = "prefetch_factor"
    default = 2
    minimum = 1
    help = "batches each worker loads ahead (DataLoader prefetch_factor; torch's default is 2)."
    most = 64  # batches ahead per worker: beyond this they only hold memory (num_workers x this batches in flight)

    def host_limit(self, host):
        return self.most, "batches ahead per worker; more only hold memory (torch's default is 2)"

    def candidates(self, host, workload):
        own = self.default_for(workload)
        return [own] + [c for c in (2, 4, 8) if c != own]

    def apply(self, value, target, ctx):
        if target.get("num_workers", 0):
            target["prefetch_factor"] = int(value)
        return target

    def script_value(self, arguments):
        if not arguments.get("num_workers"):
            return None  # no workers: nothing is fetched ahead
        return int(arguments.get("prefetch_factor") or 2)  # torch's default with workers


class PersistentWorkersKnob(_WorkerOptionKnob):
    name = "data.persistent_workers"
    script_reach = Reach.LOADER
    stage = "data"
    point = Point.LOADER
    loader_argument = "persistent_workers"
    default = False
    choices = (False, True)
    help = "keep workers alive across epochs instead of restarting them."

    def apply(self, value, target, ctx):
        if target.get("num_workers", 0):
            target["persistent_workers"] = bool(value)
        return target

    def script_value(self, arguments):
        return bool(arguments.get("persistent_workers", False)) if arguments.get("num_workers") else None


KNOBS = [NumWorkersKnob(), PinMemoryKnob(), PrefetchFactorKnob(), PersistentWorkersKnob()]
