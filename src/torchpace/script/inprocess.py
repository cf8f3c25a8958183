"""What the launch hook does inside an unmodified script's process once torch is imported.

One code path for `torchpace launch --config` and for every script-mode trial (`bench`/`tune`/`profile
-- python train.py`), so a config runs exactly as it was measured. Each knob reaches the script the way
its `script_reach` says:

- `global` (`precision.matmul`, `backends.cudnn_benchmark`): the knob's own `apply`, entered on an
  ExitStack that an atexit handler closes, so it holds for the whole script;
- `loader` (`data.num_workers`, `data.pin_memory`, `data.prefetch_factor`, `data.persistent_workers`):
  the value given to every `torch.utils.data.DataLoader`, **also where the script passes that argument
  itself** (a hard-coded `num_workers=0` is the common case worth tuning); each change is reported once
  per call site on stderr and in the process's `HookReport` (which loader, which argument, old -> new). A loader whose
  dataset cannot take a value (an IterableDataset that does not shard itself across workers) keeps the
  script's arguments, by the knob's own rule;
- `optimizer` (`optimizer.impl`): `foreach=`/`fused=` of every `torch.optim` optimizer built, also over
  the script's own argument, where the class has that implementation and it builds on the parameters'
  device (otherwise the script's arguments stand and `HookReport.not_applied` says why);
- `autocast` (`precision.amp = bf16`): see `torchpace.script.autocast`;
- `layout` (`model.channels_last`): the outermost module with 2-D convolutions converted in place
  before its first forward, and its 4-D inputs at every call, see `torchpace.script.layout`;
- `compile` (`compile.mode`): the outermost modules with trainable parameters get a compiled forward
  after the first backward(), see `torchpace.script.compile`;
- `ddp` (`ddp.bucket_cap_mb`, `ddp.gradient_as_bucket_view`, `ddp.static_graph`, `ddp.find_unused_parameters`):
  the value given to every `torch.nn.parallel.DistributedDataParallel` the script builds (a framework's too),
  also over the script's own argument, each change reported; the script's own values are its baseline's.

`process` knobs (threads, allocator, NUMA) reached the process through its env before it started;
the config's `threads.intra_op` also holds over the script's own `torch.set_num_threads()` calls
(`guard_thread_count`, each change reported).
Knobs without a `script_reach` need `torchpace.prepare()` in the script; the planner says so.

The state of all this is one `HookReport`, made by the `sitecustomize` hook and passed explicitly: to the
patches here, to the compile (`HookReport.compiled`), and to the measurement (`torchpace.script.hook`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import logging
import os
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from torchpace.knobs import REGISTRY, Knob, KnobValue, Reach, ScriptSubject, get_knob
from torchpace.script.autocast import install_outermost_autocast
from torchpace.script.compile import install_script_compile
from torchpace.script.layout import install_script_layout
from torchpace.script.scaler import install_script_scaler
from torchpace.script.sites import caller_site, library_prefixes

_log = logging.getLogger(__name__)

_PATCHED = "__torchpace_launch_knobs__"  # marks a constructor once it is wrapped
# on a DataLoader (and its iterators) or an optimizer the script built: the script's own values of the knobs
# that reach it, read from its arguments before any knob changed them (`Knob.script_value`)
OWN_SETTINGS = "__torchpace_script_settings__"


@dataclass
class HookReport:
    """What the hook did in this process (script-mode trials put it in their result).

    Attributes:
        overrides: one entry per change made to a script's DataLoader/optimizer arguments:
            {"where": "train.py:41", "object": "DataLoader", "argument", "old", "new", "knob"}.
        reached: knobs that took effect at least once (global knobs at import; loader knobs when a
            DataLoader was built with them; optimizer.impl when an optimizer was; bf16 when a forward ran;
            compile.mode when the model was compiled).
        not_applied: knob -> why it could not take effect where it was met.
        config: the knob values the hook was given (what `reached` is checked against).
        compiled: the `ScriptCompile` of `compile.mode` when the config asked for one, else None.
        script_settings: the script's own values of the knobs that reach it (`note_script_settings`): those of
            the first DataLoader it read a batch from and of the first optimizer that stepped.
    """

    overrides: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    reached: set[str] = field(default_factory=set)
    not_applied: dict[str, str] = field(default_factory=dict)
    compiled: Any = None
    script_settings: dict[str, Any] = field(default_factory=dict)
    _announced: set[tuple] = field(default_factory=set)
    _ddp: list = field(default_factory=list)  # weak references to the DistributedDataParallel modules built

    def note_ddp(self, module: Any) -> None:
        """Keep (weakly) a DistributedDataParallel module the script built: its replicas are checked across ranks."""
        self._ddp.append(weakref.ref(module))

    def ddp_models(self) -> list:
        """The DistributedDataParallel modules the script built that are still alive."""
        return [m for m in (ref() for ref in self._ddp) if m is not None]

    def record_override(self, where: str, obj: str, argument: str, old: Any, new: Any, knob: str) -> None:
        """Note one changed argument; say so on stderr the first time at this call site."""
        key = (where, obj, argument, repr(old), repr(new))
        if key in self._announced:
            return
        self._announced.add(key)
        self.overrides.append({"where": where, "object": obj, "argument": argument, "old": old, "new": new, "knob": knob})
        sys.stderr.write(f"torchpace: {obj} at {where}: {argument} {old!r} -> {new!r} ({knob})\n")
        _log.info("%s at %s: %s %r -> %r (%s)", obj, where, argument, old, new, knob)

    def note_script_settings(self, built: Any) -> None:
        """Keep the script's own settings recorded on `built` (a DataLoader iterator, an optimizer), unless
        settings of those knobs were kept already (the first DataLoader read, the first optimizer that steps)."""
        settings = getattr(built, OWN_SETTINGS, None) or {}
        if settings and not set(settings) & set(self.script_settings):
            self.script_settings.update(settings)

    def to_dict(self) -> dict[str, Any]:
        return {"overrides": list(self.overrides), "reached": sorted(self.reached), "not_applied": dict(self.not_applied),
                "script_settings": dict(self.script_settings),
                **({"compile": self.compiled.summary()} if self.compiled is not None else {})}


def apply_launch_config(values: Mapping[str, Any], report: HookReport) -> HookReport:
    """Validate `values` (knob name -> value) and let each knob, in the registry's order, take effect
    in this script's process (`Knob.apply_in_script`: the reach it declares, through `_InScript`); what
    happens goes into `report`, which is returned."""
    wanted = {get_knob(name).name: get_knob(name).validate(value) for name, value in values.items()}
    knobs = [(knob, wanted[knob.name]) for knob in REGISTRY.values() if knob.name in wanted]
    _log.info("applying %s in this script's process", {knob.name: value for knob, value in knobs} or "no knob")
    report.config.update({knob.name: value for knob, value in knobs})
    hook = _InScript(report)
    for knob, value in knobs:
        knob.apply_in_script(value, hook)
    hook.finish()
    return report


class _InScript:
    """The launch hook's side of `Knob.apply_in_script` (`torchpace.knobs.ScriptHook`): optimizers,
    autocast and compile are patched at once; global and loader knobs are gathered, then `finish` enters
    the globals on one stack and patches DataLoader once for all loader knobs."""

    def __init__(self, report: HookReport) -> None:
        self.report = report
        self.global_knobs: list[tuple[Knob, KnobValue]] = []
        self.loader_knobs: list[tuple[Knob, KnobValue]] = []
        self.ddp_knobs: list[tuple[Knob, KnobValue]] = []

    def enter_global(self, knob: Knob, value: KnobValue) -> None:
        self.global_knobs.append((knob, value))

    def give_loaders(self, knob: Knob, value: KnobValue) -> None:
        self.loader_knobs.append((knob, value))

    def hold_threads(self, knob: Knob, threads: int) -> None:
        guard_thread_count(knob.name, threads, self.report)

    def give_optimizers(self, knob: Knob, value: KnobValue) -> None:
        patch_optimizers(knob.name, str(value), self.report)

    def give_ddp(self, knob: Knob, value: KnobValue) -> None:
        self.ddp_knobs.append((knob, value))

    def autocast_forward(self, knob: Knob, value: KnobValue) -> None:
        if knob.script_reason(value) is not None or value == knob.default:
            return
        if value == "fp16":  # fp16 gradients need loss scaling: a GradScaler placed around the script's loop
            scaler = install_script_scaler(self.report, knob.name)
            install_outermost_autocast(str(value), self.report, knob.name, refused=lambda: scaler.refused)
        else:
            install_outermost_autocast(str(value), self.report, knob.name)

    def layout_forward(self, knob: Knob, value: KnobValue) -> None:
        if value != knob.default:
            install_script_layout(self.report, knob.name)

    def compile_forward(self, knob: Knob, value: KnobValue) -> None:
        if value != knob.default:
            install_script_compile(str(value), self.report, knob.name)

    def finish(self) -> None:
        apply_global_knobs(self.global_knobs, self.report)
        patch_dataloader(self.loader_knobs, self.report)
        patch_optimizers(None, None, self.report)  # no optimizer knob: its own settings are still read
        patch_ddp(self.ddp_knobs, self.report)  # also without a DDP knob: its own settings are read


def apply_global_knobs(knobs: Sequence[tuple[Knob, KnobValue]], report: HookReport) -> None:
    """Enter each knob's set-and-restore context for the rest of the process (closed at exit)."""
    if not knobs:
        return
    stack = contextlib.ExitStack()
    for knob, value in knobs:
        knob.apply(value, stack, None)
        _log.info("%s = %r set for the rest of this process", knob.name, value)
        report.reached.add(knob.name)
    atexit.register(stack.close)


def guard_thread_count(knob_name: str, threads: int, report: HookReport) -> None:
    """The config's intra-op thread count (set through OMP_NUM_THREADS before the script started) also
    over the script's own `torch.set_num_threads(n)` calls, each change reported as a DataLoader's is.
    Calls from torch itself (a DataLoader worker sets 1 thread) and from the processes the script forks
    are left alone."""
    import torch

    original = torch.set_num_threads
    if getattr(original, _PATCHED, None) is not None:
        return
    libraries = library_prefixes()
    owner = os.getpid()

    @functools.wraps(original)
    def set_num_threads(count: int) -> None:
        caller = sys._getframe(1).f_code.co_filename
        if os.getpid() != owner or caller.startswith(libraries) or count == threads:
            original(count)
            return
        report.record_override(caller_site(), "torch.set_num_threads", "threads", count, threads, knob_name)
        original(threads)

    setattr(set_num_threads, _PATCHED, threads)
    torch.set_num_threads = set_num_threads
    report.reached.add(knob_name)


def _bound_with_own_settings(signature: inspect.Signature, reach: Reach, *args: Any, **kwargs: Any):
    """(the call's bound arguments, the script's own value of each knob of `reach` in them: `Knob.script_value` of
    every parameter as the call gives it or defaults it)."""
    bound = signature.bind_partial(*args, **kwargs)
    given = {name: bound.arguments.get(name, _default_of(signature, name)) for name in signature.parameters}
    knobs = (knob for knob in REGISTRY.values() if knob.script_reach is reach)
    return bound, {knob.name: value for knob in knobs if (value := knob.script_value(given)) is not None}


def patch_dataloader(knobs: Sequence[tuple[Knob, KnobValue]], report: HookReport) -> None:
    """Give every `torch.utils.data.DataLoader` (subclasses included) the LOADER knobs' values, and record on
    each (and on its iterators) the script's own settings of those knobs (`OWN_SETTINGS`), also without any."""
    import torch.utils.data

    loader_cls = torch.utils.data.DataLoader
    original = loader_cls.__init__
    if getattr(original, _PATCHED, None) is not None:
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound, own = _bound_with_own_settings(signature, Reach.LOADER, self, *args, **kwargs)
        fitting = _fitting(knobs, bound.arguments.get("dataset"), report)
        changes = loader_overrides(fitting, bound.arguments, signature)
        where = caller_site()
        for name, (old, new, knob) in changes.items():
            bound.arguments[name] = new
            report.record_override(where, type(self).__name__, name, old, new, knob)
        report.reached.update(knob.name for knob, _ in fitting)
        original(*bound.args, **bound.kwargs)
        with contextlib.suppress(AttributeError):  # a loader class with __slots__: its settings stay unread
            setattr(self, OWN_SETTINGS, own)

    original_iterator = loader_cls._get_iterator

    @functools.wraps(original_iterator)
    def _get_iterator(self: Any) -> Any:
        iterator = original_iterator(self)
        with contextlib.suppress(AttributeError):
            setattr(iterator, OWN_SETTINGS, getattr(self, OWN_SETTINGS, None))
        return iterator

    setattr(__init__, _PATCHED, tuple(knobs))
    loader_cls.__init__ = __init__
    loader_cls._get_iterator = _get_iterator


def patch_ddp(knobs: Sequence[tuple[Knob, KnobValue]], report: HookReport) -> None:
    """Give every `DistributedDataParallel` the script builds the DDP knobs' values (over its own arguments, each
    change reported), keep each one for the ranks' replica check, and record the script's own settings of the
    first (with `distributed.strategy = ddp`: the script's own data parallelism)."""
    import torch.distributed

    if not torch.distributed.is_available():
        return
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__
    if getattr(original, _PATCHED, None) is not None:
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound, own = _bound_with_own_settings(signature, Reach.DDP, self, *args, **kwargs)
        where = caller_site()
        for knob, value in knobs:
            old = own.get(knob.name, knob.default)
            bound.arguments[knob.argument] = value
            report.reached.add(knob.name)
            if not _same(old, value):
                report.record_override(where, type(self).__name__, knob.argument, old, value, knob.name)
        original(*bound.args, **bound.kwargs)
        _let_gloo_workers_release_at_exit()
        if not report.ddp_models():
            report.script_settings.update({"distributed.strategy": "ddp", **own})
        report.note_ddp(self)

    setattr(__init__, _PATCHED, tuple(knobs))
    DistributedDataParallel.__init__ = __init__


_GIL_WINDOW_AT_EXIT_S = 0.1


@functools.cache
def _let_gloo_workers_release_at_exit() -> None:
    """Once per process that builds a DDP: an atexit handler that releases the GIL for a moment.

    A gloo worker thread drops its last reference to a finished allreduce after the waiting rank has gone on;
    where the work's thread-local state holds a Python object (a static-graph DDP's always does; other DDPs' after
    the script traced or exported its model), that drop waits for the GIL. If the main thread is past its last
    blocking call by then, it holds the GIL into interpreter finalization, the worker's GIL wait ends the thread
    inside a noexcept destructor, and the rank dies with SIGABRT ("terminate called without an active exception")
    after a complete run: about one exit in four of a 2-rank gloo job with `static_graph=True` (torch 2.13, with or
    without torchpace). Sleeping here lets the worker take the GIL and finish before finalization starts."""
    atexit.register(time.sleep, _GIL_WINDOW_AT_EXIT_S)


def _fitting(knobs: Sequence[tuple[Knob, KnobValue]], dataset: Any, report: HookReport) -> list[tuple[Knob, KnobValue]]:
    """The knobs whose value can run with `dataset`, by the knobs' own rule (e.g. no workers for an
    IterableDataset that would be read once per worker); the others are noted as not applied."""
    loader_only = ScriptSubject(name="DataLoader", dataset=dataset)
    kept = []
    for knob, value in knobs:
        reason = knob.value_applies(value, None, loader_only)
        if reason is None:
            kept.append((knob, value))
        else:
            report.not_applied.setdefault(knob.name, f"a DataLoader at {caller_site()}: {reason}")
            _log.info("%s = %r not applied to the DataLoader at %s: %s", knob.name, value, caller_site(), reason)
    return kept


def loader_overrides(knobs: Sequence[tuple[Knob, KnobValue]], explicit: Mapping[str, Any],
                     signature: inspect.Signature | None = None) -> dict[str, tuple[Any, Any, str]]:
    """The DataLoader arguments the knobs change: name -> (the script's value, the knob's, knob name).

    Each knob applies to the arguments so far, as in `prepare()` (so `prefetch_factor` follows a
    `num_workers` that a knob raised from the script's 0). The script's value is what it passed, else
    the DataLoader's default from `signature`.
    """
    merged = {k: v for k, v in explicit.items() if k != "self"}
    changes: dict[str, tuple[Any, Any, str]] = {}
    for knob, value in knobs:
        scratch = dict(merged)
        knob.apply(value, scratch, None)
        for name, new in scratch.items():
            current = merged[name] if name in merged else _default_of(signature, name)
            if _same(current, new):
                continue  # not this knob's change
            changes[name] = (changes[name][0] if name in changes else current, new, knob.name)
            merged[name] = new
    return {name: change for name, change in changes.items() if not _same(change[0], change[1])}


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b)


def _default_of(signature: inspect.Signature | None, name: str) -> Any:
    if signature is None or name not in signature.parameters:
        return None
    default = signature.parameters[name].default
    return None if default is inspect.Parameter.empty else default


def patch_optimizers(knob_name: str | None, impl: str | None, report: HookReport) -> None:
    """Build every torch.optim optimizer that has an `impl` (foreach/fused) implementation with it (`default`:
    torch's own choice, `foreach=None, fused=None`, over the script's arguments), and record on each the script's
    own `optimizer.impl` (`OWN_SETTINGS`); `impl` None records only."""
    import torch.optim

    for cls in {c for c in vars(torch.optim).values() if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)}:
        original = cls.__init__
        if getattr(original, _PATCHED, None) is not None or cls is torch.optim.Optimizer:
            continue
        signature = inspect.signature(original)
        if "foreach" in signature.parameters or "fused" in signature.parameters:
            cls.__init__ = _with_impl(original, signature, knob_name, impl, report)


def _with_impl(original, signature: inspect.Signature, knob_name: str | None, impl: str | None, report: HookReport):
    knob = REGISTRY["optimizer.impl"]
    flags = {} if impl is None else {"foreach": None, "fused": None} if impl == "default" else \
        {"foreach": impl == "foreach", "fused": impl == "fused"}

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs)
        own = knob.script_value({k: bound.arguments.get(k, _default_of(signature, k)) for k in ("foreach", "fused")})
        if impl is None or (impl != "default" and impl not in signature.parameters):
            original(*bound.args, **bound.kwargs)
            _record_own(self, own)
            return
        wanted = {k: v for k, v in flags.items() if k in signature.parameters}
        changed = {k: (bound.arguments.get(k, _default_of(signature, k)), v) for k, v in wanted.items()
                   if not _same(bound.arguments.get(k, _default_of(signature, k)), v)}
        trial = signature.bind_partial(self, *args, **kwargs)
        trial.arguments.update(wanted)
        try:
            original(*trial.args, **trial.kwargs)
        except (RuntimeError, ValueError, TypeError) as err:  # this class or device has no such kernel
            report.not_applied.setdefault(knob_name, f"{type(self).__name__}({impl}=True) at {caller_site()}: {err}")
            _log.info("%s not applied: %s(%s=True) at %s failed: %s", knob_name, type(self).__name__, impl, caller_site(), err)
            original(*bound.args, **bound.kwargs)
            _record_own(self, own)
            return
        _record_own(self, own)
        report.reached.add(knob_name)
        where = caller_site()
        for name, (old, new) in changed.items():
            report.record_override(where, type(self).__name__, name, old, new, knob_name)

    setattr(__init__, _PATCHED, impl or "recorded")
    return __init__


def _record_own(optimizer: Any, impl: KnobValue | None) -> None:
    """Note the script's own `optimizer.impl` on an optimizer it built (None: its arguments name none)."""
    if impl is not None:
        with contextlib.suppress(AttributeError):
            setattr(optimizer, OWN_SETTINGS, {"optimizer.impl": impl})
