"""Distributed-stage knobs: data parallelism over several processes through torchrun.

`nproc_per_node` is process-level (how many processes a trial, `bench` or `torchpace launch` starts);
`distributed.strategy` wraps the model in `prepare()` (DDP, or FSDP: `fully_shard` where torch has it);
the `ddp.*` and `fsdp.*` knobs shape that wrapper. The backend is gloo on CPU and nccl on GPU unless
`distributed.backend` asks for one. The workload's `batch_size` stays the per-process batch: the
global batch is `batch_size * world size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from torchpace.knobs.base import IntKnob, Knob, KnobValue, LaunchFlag, Point, Reach
from torchpace.knobs.child import ChildPart, Setting, Source


def usable_devices(host) -> int:
    """How many processes this host can give a device each: its GPUs, else its usable CPU cores."""
    return len(host.gpus) if host.cuda_available and host.gpus else max(1, host.usable_cores)


def nproc_of(values) -> int:
    """The `nproc_per_node` of a config's values (1 when not set)."""
    return int(values.get("nproc_per_node", 1) or 1)


@dataclass(frozen=True)
class DataParallel:
    """What a config asks of data parallelism, each knob at its default where the config does not set it.

    Attributes:
        strategy: `none`, `ddp` or `fsdp` (`distributed.strategy`).
        backend: `auto`, `gloo` or `nccl` (`distributed.backend`).
        ddp: DistributedDataParallel's keyword arguments (the `ddp.*` knobs).
        fsdp: `fully_shard`'s keyword arguments (the `fsdp.*` knobs).
    """

    strategy: str
    backend: str
    ddp: Mapping[str, KnobValue]
    fsdp: Mapping[str, KnobValue]

    @property
    def enabled(self) -> bool:
        return self.strategy != "none"

    @property
    def wrapper_options(self) -> Mapping[str, KnobValue]:
        """The keyword arguments of the strategy's wrapper (none without a strategy)."""
        return {"ddp": self.ddp, "fsdp": self.fsdp}.get(self.strategy, {})


def data_parallel(values: Mapping[str, Any]) -> DataParallel:
    """The data parallelism of a config's `values` (a full or partial knob name -> value mapping)."""
    def value(knob: Knob) -> KnobValue:
        return values.get(knob.name, knob.default)

    options: dict[str, dict[str, KnobValue]] = {"ddp": {}, "fsdp": {}}
    for knob in KNOBS:
        if isinstance(knob, _WrapperOption):
            options[knob.wrapper][knob.argument] = value(knob)
    return DataParallel(str(value(STRATEGY)), str(value(BACKEND)), options["ddp"], options["fsdp"])


def _without_torch_distributed() -> str | None:
    import torch

    return None if torch.distributed.is_available() else "this torch build has no torch.distributed"


def _needs_strategy(name: str, values: dict, strategy: str) -> str | None:
    if values.get(STRATEGY.name, STRATEGY.default) != strategy:
        return f"{name} shapes the {strategy.upper()} wrapper: it needs {STRATEGY.name} = {strategy}"
    return None


class NprocPerNodeKnob(IntKnob):
    name = "nproc_per_node"
    stage = "distributed"
    shares_cores = True
    point = Point.ENV
    default = 1
    minimum = 1
    training_only = True
    help = "processes on this host, one per GPU (or per share of the CPU cores), started through torchrun."
    plan_order = 10  # first: the NUMA binding and the threads depend on how many processes there are
    launch_flag = LaunchFlag("--nproc-per-node", "Processes on this node; more than 1 runs the script through torchrun.  "
                             "[default: 1]")

    def applies(self, host, workload):
        return super().applies(host, workload) or _without_torch_distributed()

    def candidates(self, host, workload):
        devices = usable_devices(host)
        return [1, *[n for n in (2, 4, 8) if n <= devices]]

    def host_limit(self, host):
        devices = usable_devices(host)
        kind = "GPU(s)" if host.cuda_available and host.gpus else "usable CPU core(s)"
        return devices, f"one process per device, and this host has {devices} {kind}"

    def conflicts(self, values):
        if values.get(self.name, 1) > 1 and values.get("distributed.strategy", "none") == "none":
            return "nproc_per_node > 1 needs distributed.strategy = ddp or fsdp (else each process trains alone)"
        return None

    def companions(self, value) -> dict:
        """What the tuner sets alongside `value` when the incumbent config cannot take it alone."""
        return {"distributed.strategy": "ddp"} if value > 1 else {}

    def plan_child(self, value, given, request, draft):
        """How many processes the child runs (more than one: under torchrun, planned by the caller)."""
        configured = int(value or 1)
        draft.nproc = given or configured
        if given is None and value is not None:
            return ChildPart([Setting(self.name, str(configured), Source.CONFIG,
                                      f"{self.name} = {configured} in {request.config_name}")])
        if given is not None:
            return ChildPart([Setting(self.name, str(given), Source.CLI, f"--nproc-per-node {given}")])
        return ChildPart([Setting(self.name, "1", Source.DEFAULT, "one process per node")])

    def in_effect(self, value, host):
        from torchpace.engine.distributed import RankEnv

        return RankEnv.from_env().local_world_size == value


class StrategyKnob(Knob):
    name = "distributed.strategy"
    stage = "distributed"
    point = Point.MODEL
    default = "none"
    choices = ("none", "ddp", "fsdp")
    training_only = True
    apply_order = 80  # after channels_last and activation checkpointing, before torch.compile
    help = "data parallelism: DistributedDataParallel, or FSDP (fully_shard; shards parameters, grads, optimizer state)."

    def applies(self, host, workload):
        return super().applies(host, workload) or _without_torch_distributed()

    def candidates(self, host, workload):
        return ["none", "ddp", "fsdp"] if usable_devices(host) > 1 else ["none"]

    def value_applies(self, value, host, workload):
        if value == "fsdp":
            from torchpace.engine.distributed import fsdp_flavour

            if fsdp_flavour() is None:
                return "this torch version has neither fully_shard nor FullyShardedDataParallel"
        return None

    def pointless(self, values) -> str | None:
        """Why the tuner need not try this config (it runs, but cannot be faster)."""
        if values.get(self.name) != "none" and values.get("nproc_per_node", 1) == 1:
            return "one process: nothing to distribute"
        return None

    def apply(self, value, target, ctx):
        if value == "none" or ctx.dist is None:
            return target
        from torchpace.engine.distributed import wrap_model

        return wrap_model(target, data_parallel(ctx.values).wrapper_options, ctx.dist, ctx.device)


class BackendKnob(Knob):
    name = "distributed.backend"
    stage = "distributed"
    point = Point.MODEL
    default = "auto"
    choices = ("auto", "gloo", "nccl")
    training_only = True
    help = "process group backend: auto is nccl on GPUs, gloo on CPU."

    def candidates(self, host, workload):
        return ["auto"]

    def value_applies(self, value, host, workload):
        if value == "nccl":
            import torch

            if not host.cuda_available:
                return "nccl runs on CUDA GPUs and this host has none: use gloo (or auto)"
            if not torch.distributed.is_nccl_available():
                return "this torch build has no NCCL"
        return None

    def conflicts(self, values):
        if values.get(self.name) != "auto":
            return None if values.get("distributed.strategy", "none") != "none" else \
                "distributed.backend needs distributed.strategy = ddp or fsdp"
        return None


class _WrapperOption(Knob):
    """A keyword argument of the DDP or FSDP wrapper: `wrapper` (ddp/fsdp) and the `argument` the
    knob's value is passed as (`torchpace.engine.distributed.wrap_model`)."""

    wrapper: ClassVar[str]
    argument: ClassVar[str]
    stage = "distributed"
    point = Point.MODEL
    training_only = True

    def conflicts(self, values):
        return _needs_strategy(self.name, values, self.wrapper) if values.get(self.name, self.default) != self.default else None


class _DdpOption(_WrapperOption):
    """A DistributedDataParallel argument: `prepare()` gives it to the DDP wrapper of a `ddp` config, and the
    launch hook to every DistributedDataParallel an unmodified script builds (`Reach.DDP`), over the script's
    own argument; the script's own value (`script_value`) is its baseline's, and a script that built a DDP
    runs with `distributed.strategy = ddp` as its own setting, so the knob's conflicts hold for it too."""

    wrapper = "ddp"
    script_reach = Reach.DDP
    shares_cores = False

    def script_value(self, arguments):
        """The script's own value of the argument (DDP's default where it passed none)."""
        if self.argument not in arguments:
            return None
        value = arguments[self.argument]
        return self.default if value is None else self.validate(value)

    def applies(self, host, workload):
        return super().applies(host, workload) or _without_torch_distributed()


class BucketCapKnob(_DdpOption, IntKnob):
    name = "ddp.bucket_cap_mb"
    argument = "bucket_cap_mb"
    stage = "distributed"
    point = Point.MODEL
    default = 25
    minimum = 1
    help = "DDP gradient bucket size in MiB: bigger buckets, fewer all-reduces; smaller, earlier overlap with backward."
    most = 1024  # MiB: one bucket this big already holds the gradients of a 250M-parameter fp32 model

    def host_limit(self, host):
        return self.most, "MiB per bucket; a larger bucket only delays the first all-reduce and holds memory"

    def candidates(self, host, workload):
        return [25, 5, 100]


class _DdpFlag(_DdpOption):
    default = False
    choices = (False, True)


class GradientAsBucketViewKnob(_DdpFlag):
    name = "ddp.gradient_as_bucket_view"
    argument = "gradient_as_bucket_view"
    help = "gradients are views into DDP's all-reduce buckets: one copy less per step, less memory."


class StaticGraphKnob(_DdpFlag):
    name = "ddp.static_graph"
    argument = "static_graph"
    help = "tell DDP the graph is the same every step (lets it skip unused-parameter search, overlap better)."


class FindUnusedParametersKnob(_DdpFlag):
    name = "ddp.find_unused_parameters"
    argument = "find_unused_parameters"
    help = ("DDP traverses the autograd graph every step to find parameters the forward did not use; off where every "
            "parameter is used (Hugging Face's Trainer turns it on by default: a step that then needs it fails).")


class ReshardAfterForwardKnob(_WrapperOption):
    name = "fsdp.reshard_after_forward"
    wrapper, argument = "fsdp", "reshard_after_forward"
    default = True
    choices = (True, False)
    help = "free gathered parameters after forward (less memory) or keep them for backward (one all-gather less)."


STRATEGY, BACKEND = StrategyKnob(), BackendKnob()
KNOBS = [NprocPerNodeKnob(), STRATEGY, BACKEND, BucketCapKnob(), GradientAsBucketViewKnob(), StaticGraphKnob(),
         FindUnusedParametersKnob(), ReshardAfterForwardKnob()]
