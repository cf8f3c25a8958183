"""`prepare()`: the ONE place where knobs take effect.

`bench`, every tune trial, `profile` and users' own loops call it, so a config behaves the same in
the tuner and in production. Knobs apply at their point, in this order: GLOBAL (inside an ExitStack
that `Prepared.close()` / leaving the `with` block unwinds), MODEL (in `apply_order`: layout and
checkpointing, then the DDP/FSDP wrapper, then torch.compile), OPTIMIZER (built on the final model's
parameters: FSDP replaces them with shards), DATASET, LOADER, STEP.
A distributed config (`distributed.strategy` ddp or fsdp) first joins the process group (torchrun's,
or a one-process group, joined once for the process) and puts each rank on its own device; the loader then reads this rank's
`DistributedSampler` shard of `batch_size` samples per step (see `torchpace.engine.distributed`).
ENV knobs (allocator, NUMA, thread env vars) cannot change a running process: `prepare()` records
them in `Prepared.needs_launch`, and trials and `torchpace launch` put them in the child's env.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping

import torch

from torchpace.config import RunConfig, check_on_host, resolve_config
from torchpace.errors import UsageError
from torchpace.host import HostFacts, probe_host
from torchpace.knobs import REGISTRY, ApplyContext, Point, workload_defaults
from torchpace.knobs.distributed import data_parallel
from torchpace.engine.batch import batch_len, split_batch, to_device
from torchpace.engine.compile import mark_cuda_graph_step
from torchpace.workload import Workload, check_workload

_log = logging.getLogger(__name__)


@dataclass
class StepOptions:
    """How the step function runs; STEP knobs fill it in, and the others' `configure_step`."""

    amp_dtype: torch.dtype | None = None
    grad_scaler: bool = False
    micro_batch_size: int | None = None
    channels_last_inputs: bool = False
    cuda_graph_steps: bool = False  # compile.mode replays CUDA graphs: each step marks a new iteration
    non_blocking: bool = False
    label_phases: bool = False  # emit record_function labels (for `torchpace profile`)
    inference_mode: bool = False  # inference under torch.inference_mode() instead of torch.no_grad()


@dataclass
class Prepared:
    """A workload with a config applied: use `loader` and `step(batch)` in a training loop.

    `step(batch)` moves the batch to the device, runs forward, loss, backward (with micro-batch
    accumulation), gradient clipping, optimizer and scheduler steps, and returns the loss as a
    detached device tensor (no host sync; call `.item()` yourself when you need the number).
    For inference workloads it returns the model's output.
    """

    workload: Workload
    config: RunConfig
    host: HostFacts
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    loader: torch.utils.data.DataLoader
    options: StepOptions
    needs_launch: list[str] = field(default_factory=list)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)
    dist: Any = None  # torchpace.engine.distributed.Dist for a distributed config
    _scaler: Any = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if self.options.grad_scaler:
            self._scaler = torch.amp.GradScaler(self.device.type)

    @property
    def world_size(self) -> int:
        """Processes training together (1 without a distributed config)."""
        return self.dist.world_size if self.dist is not None else 1

    @property
    def grad_accumulation(self) -> int:
        """Micro-batches per optimizer step (1 without data.micro_batch_size)."""
        micro = self.options.micro_batch_size
        return 1 if micro is None else -(-self.workload.batch_size // micro)

    def to_device(self, batch: Any) -> Any:
        """Copy a loader batch to the device (non_blocking when pinned; channels_last if asked)."""
        with self._phase("torchpace.h2d"):
            return to_device(batch, self.device, self.options.non_blocking, self.options.channels_last_inputs)

    def step(self, batch: Any) -> torch.Tensor:
        """One optimizer step (or one inference forward) on a loader batch."""
        return self.step_on_device(self.to_device(batch))

    def step_on_device(self, batch: Any) -> torch.Tensor:
        """`step` for a batch already on the device (how compute-only throughput is measured)."""
        if self._closed:
            raise UsageError("step() after the `with prepare(...)` block ended: the block restored the global torch "
                             "state this config set; step inside the block, or call prepare() again")
        if self.options.cuda_graph_steps:
            mark_cuda_graph_step()
        if not self.workload.is_training:
            return self._infer(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss_total = self._forward_backward(batch)
        with self._phase("torchpace.optimizer"):
            self._optimizer_step()
        return loss_total

    def _forward_backward(self, batch: Any) -> torch.Tensor:
        micro = self.options.micro_batch_size
        chunks = split_batch(batch, micro) if micro else [batch]
        total = batch_len(batch) if len(chunks) > 1 else 1
        loss_total = torch.zeros((), device=self.device)
        for chunk in chunks:
            with self._phase("torchpace.forward"), self._autocast():
                loss = self.workload.loss(self._forward(chunk), chunk)
            if len(chunks) > 1:
                loss = loss * (batch_len(chunk) / total)
            with self._phase("torchpace.backward"):
                (self._scaler.scale(loss) if self._scaler else loss).backward()
            loss_total += loss.detach().float()
        return loss_total

    def _optimizer_step(self) -> None:
        if self.workload.clip_grad_norm is not None:
            if self._scaler:
                self._scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.workload.clip_grad_norm)
        if self._scaler:
            self._scaler.step(self.optimizer)
            self._scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def _infer(self, batch: Any) -> Any:
        grad_free = torch.inference_mode() if self.options.inference_mode else torch.no_grad()
        with grad_free, self._phase("torchpace.forward"), self._autocast():
            return self._forward(batch)

    def _forward(self, batch: Any) -> Any:
        if self.workload.forward is not None:
            return self.workload.forward(self.model, batch)
        return self.model(batch[0] if isinstance(batch, (list, tuple)) else batch)

    def _autocast(self):
        if self.options.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.options.amp_dtype)

    def _phase(self, name: str):
        if self.options.label_phases:
            return torch.profiler.record_function(name)
        return contextlib.nullcontext()

    def close(self) -> None:
        """Restore the global torch state this config changed; step() is refused afterwards."""
        self._stack.close()
        self._closed = True

    def __enter__(self) -> "Prepared":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_config(config: RunConfig, host: HostFacts, workload: Workload) -> None:
    """Raise UsageError for a set knob that does not apply here (to this host: `check_on_host`; to
    this workload), values that conflict (with the workload's own where the config sets none), or
    `Workload.loader_options` that no knob owns or that its knob refuses."""
    check_on_host(config, host, workload_defaults(workload))
    for name, value in config.values.items():
        knob = REGISTRY[name]
        if value in (knob.default, knob.default_for(workload)):
            continue
        reason = knob.applies(host, workload) or knob.value_applies(value, host, workload)
        if reason:
            raise UsageError(f"knob {name!r} = {value!r} does not apply here: {reason}")


def _default_device(host: HostFacts) -> torch.device:
    return torch.device("cuda" if host.cuda_available else "cpu")


def _build_loader(workload: Workload, dataset: Any, kwargs: dict[str, Any], dist: Any = None) -> torch.utils.data.DataLoader:
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    generator = torch.Generator().manual_seed(workload.seed)
    kwargs = dict(kwargs)
    batch_size = kwargs.pop("batch_size", workload.batch_size)  # a LOADER knob may set it (inference.batch_size)
    sampler = None
    if dist is not None:
        from torchpace.engine.distributed import distributed_sampler

        sampler = distributed_sampler(dataset, dist, workload.shuffle, workload.seed)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=workload.shuffle and not iterable and sampler is None,
        drop_last=workload.is_training,
        collate_fn=workload.collate_fn,
        generator=generator,
        **kwargs,
    )


def prepare(
    workload: Workload | None = None,
    config: RunConfig | Mapping[str, Any] | str | None = None,
    *,
    device: str | torch.device | None = None,
    host: HostFacts | None = None,
    label_phases: bool = False,
    **parts: Any,
) -> Prepared:
    """Apply `config` to a workload and return what a training loop needs.

    Args:
        workload: a Workload, or None to build one from `parts` (model=, dataset=, loss=, ...).
        config: a RunConfig, a dict of knob values, a path to torchpace.toml, or None (defaults). A
            knob it does not set has the workload's own value (`Workload.loader_options`), else the
            knob's default; `Prepared.config` holds both.
        device: where to run; default CUDA when available, else CPU.
        host: HostFacts (probed when None).
        label_phases: emit `record_function` labels per phase (used by `torchpace profile`).

    Returns:
        Prepared (also a context manager that restores global torch state on exit).

    Raises:
        UsageError: a knob does not apply here or values conflict; a Workload of the wrong shape;
            both a workload and parts, or a config that is none of the accepted kinds.
    """
    workload = _workload_from(workload, parts)
    config = resolve_config(config)
    host = host or probe_host()
    check_config(config, host, workload)
    config = config.with_defaults(workload_defaults(workload))  # the workload's own DataLoader arguments
    values = config.full_values()
    device = torch.device(device) if device is not None else None
    dist = None
    parallel = data_parallel(values)
    if parallel.enabled and workload.is_training:
        from torchpace.engine.distributed import setup_distributed

        dist, device = setup_distributed(parallel.strategy, parallel.backend, device, host.cuda_available)
    device = device or _default_device(host)
    _log.info("prepare %r on %s: %s", workload.name, device, config.non_default() or "no knob set (the defaults)")
    ctx = ApplyContext(host, workload, device, values, dist)
    by_point = {p: sorted((k for k in REGISTRY.values() if k.point is p), key=lambda k: k.apply_order) for p in Point}

    stack = contextlib.ExitStack()
    for knob in by_point[Point.GLOBAL]:
        knob.apply(values[knob.name], stack, ctx)
    try:
        model = workload.model.to(device)
        model.train(workload.is_training)
        for knob in by_point[Point.MODEL]:
            model = knob.apply(values[knob.name], model, ctx)
        optimizer, scheduler = _build_optimizer(workload, model, by_point[Point.OPTIMIZER], values, ctx)
        dataset = workload.dataset
        for knob in by_point[Point.DATASET]:
            dataset = knob.apply(values[knob.name], dataset, ctx)
        loader_kwargs: dict[str, Any] = {}
        for knob in by_point[Point.LOADER]:
            knob.apply(values[knob.name], loader_kwargs, ctx)
        options = StepOptions(label_phases=label_phases)
        for knob in by_point[Point.STEP]:
            knob.apply(values[knob.name], options, ctx)
        for knob in REGISTRY.values():  # what knobs of the other points change in the step (see Knob.configure_step)
            knob.configure_step(values[knob.name], options, ctx)
    except BaseException:
        stack.close()
        raise
    prepared = Prepared(workload, config, host, device, model, optimizer, scheduler,
                        _build_loader(workload, dataset, loader_kwargs, dist), options, pending_env_knobs(config, host), stack,
                        dist=dist)
    if prepared.needs_launch:
        warnings.warn(f"process-level knobs {prepared.needs_launch} take effect only in a new process: "
                      "use `torchpace launch --config ...`", stacklevel=2)
    return prepared


def _workload_from(workload: Any, parts: dict[str, Any]) -> Workload:
    """`workload`, or a Workload built from `parts`, checked (`check_workload`); UsageError for both or neither."""
    if workload is not None and parts:
        raise UsageError(f"prepare() got a Workload and also {', '.join(f'{k}=' for k in parts)}: pass either a "
                         "Workload or its parts (model=, dataset=, loss=, ...), not both")
    if workload is None:
        names = [f.name for f in fields(Workload)]
        unknown = [name for name in parts if name not in names]
        missing = [name for name in ("model", "dataset") if name not in parts]
        if unknown or missing:
            raise UsageError(f"prepare(): unknown part(s) {unknown}, missing part(s) {missing}; a Workload's "
                             f"parts are {', '.join(names)} (model and dataset are required)")
        workload = Workload(**parts)
    check_workload(workload)
    return workload


def _build_optimizer(workload: Workload, model: torch.nn.Module, knobs: list, values: dict, ctx: ApplyContext):
    """The workload's optimizer (AdamW lr=1e-3 by default) with OPTIMIZER knobs, and its scheduler."""
    if not workload.is_training:
        return None, None
    factory: Callable = workload.optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-3))
    optimizer = factory(model.parameters())
    for knob in knobs:
        optimizer = knob.apply(values[knob.name], optimizer, ctx)
    scheduler = workload.scheduler(optimizer) if workload.scheduler else None
    return optimizer, scheduler


def pending_env_knobs(config: RunConfig, host: HostFacts) -> list[str]:
    """ENV knobs set to a non-default value that this process is not already running with."""
    return [
        name for name, value in config.non_default().items()
        if REGISTRY[name].point is Point.ENV and not REGISTRY[name].in_effect(value, host)
    ]
