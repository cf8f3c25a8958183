"""The knob plug-in: one tunable setting, where it takes effect, and when it applies.

Lifecycle, in the order torchpace calls it:

1. `validate(value)` when a config is built (bad value -> UsageError naming valid values);
2. `applies(host, workload)` -> None, or the reason the knob does not apply on this host/workload;
3. `conflicts(values)` -> None, or why this value cannot go with the other knobs' values;
4. `candidates(host, workload)` -> the values a tuner should try, the default first; `companions(value)`
   and `pointless(values)` tell the tuner what must go with a value and which configs cannot gain;
5. process-level knobs (point ENV, and `threads.intra_op` as OMP_NUM_THREADS) take effect in a child
   process: `torchpace.launch.plan.plan_child` (the one planner of trials, bench, profile and launch)
   asks every knob, in `plan_order`, for its part of the child's env and argv (`plan_child(value,
   given, request, draft)`, see `torchpace.knobs.child`), never torchpace's own env; `launch_flag`
   names the `ChildOptions` field that gives the knob's value on the command line; `in_effect(value,
   host)` says whether this process already runs with them;
6. `apply(value, target, ctx)` inside `prepare()`, at exactly the knob's `point`; knobs of one point
   apply in `apply_order` (lower first: layout and checkpointing, then the DDP/FSDP wrapper, export,
   compile last);
7. `configure_step(value, options, ctx)` once every knob has applied: what else a value changes in how
   each step runs (the mutable StepOptions), for knobs whose point is not STEP (pinned loader batches
   are copied with non_blocking=True; channels_last models get channels_last inputs).

Script mode (an unmodified `train.py`, see `torchpace.script`): `script_reach` (a `Reach`) says how a
knob reaches a script it cannot edit — `process` (the child's env/argv), `global` (torch state set at
import), `loader` (DataLoader arguments), `optimizer` (optimizer constructor arguments), `autocast`
(around the outermost module's forward), `layout` (the outermost module with 2-D convolutions and
its 4-D inputs in channels_last), `compile` (the outermost module compiled in place after the
first backward()) — or None when only `prepare()` can apply it;
`script_reason(value)` says why a particular value cannot reach a script (e.g. fp16 needs a GradScaler
in the loop); `apply_in_script(value, hook)` is its action inside the script's process, through what
the launch hook offers (`ScriptHook`), by default the one its reach names.

`applies`, `value_applies` and `candidates` read what a knob is applied to through `KnobSubject`: a
`Workload`, or a `ScriptSubject` for code torchpace cannot see into before it runs.

`apply` targets by point: ENV -> nothing in-process (see plan_child); GLOBAL -> an ExitStack to enter
a set-and-restore context on; DATASET -> the dataset, returns the (possibly new) dataset the
loader reads (e.g. another decoder or file format); LOADER -> the DataLoader kwargs dict; MODEL -> the model, returns the
(possibly new) model; OPTIMIZER -> the optimizer, returns the (possibly new) optimizer; STEP -> the
mutable StepOptions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from torchpace.errors import UsageError

if TYPE_CHECKING:
    from torchpace.host import HostFacts
    from torchpace.knobs.child import ChildDraft, ChildPart, ChildRequest
    from torchpace.workload import Workload

KnobValue = bool | int | float | str

STAGES = ("system", "data", "compute", "memory", "distributed", "inference")


class Point(str, enum.Enum):
    """Where a knob takes effect (docs/design.md#config-and-knobs)."""

    ENV = "env"
    GLOBAL = "global"
    DATASET = "dataset"
    LOADER = "loader"
    MODEL = "model"
    OPTIMIZER = "optimizer"
    STEP = "step"


class Reach(str, enum.Enum):
    """How a knob reaches an unmodified script (`Knob.script_reach`; None: only `prepare()` applies it)."""

    PROCESS = "process"
    GLOBAL = "global"
    LOADER = "loader"
    OPTIMIZER = "optimizer"
    AUTOCAST = "autocast"
    LAYOUT = "layout"
    COMPILE = "compile"
    DDP = "ddp"

    def __str__(self) -> str:
        return self.value

    @property
    def reaches(self) -> str:
        """What of the script it reaches, in words."""
        return _REACH_TEXT[self][0]

    @property
    def in_process(self) -> bool:
        """True when the launch hook applies it inside the script's process (not through the env/argv)."""
        return self is not Reach.PROCESS

    @property
    def how(self) -> str:
        """How the launch hook applies it inside the script (empty for `process`)."""
        return _REACH_TEXT[self][1]

    @property
    def sets_arguments(self) -> bool:
        """True when it gives the script's objects their arguments (DataLoader, optimizer), over the script's own:
        then every value, the knob's default included, changes what runs where the script chose otherwise."""
        return self in (Reach.LOADER, Reach.OPTIMIZER, Reach.DDP)

    @property
    def missed(self) -> str | None:
        """What a script lacked when a knob of this reach never took effect in it; None when the knob
        takes effect without meeting anything (torch's global state, the process's env)."""
        return _REACH_TEXT[self][2]


# reach -> (what it reaches, how the hook applies it, what a script it never met lacked)
_REACH_TEXT: dict[Reach, tuple[str, str, str | None]] = {
    Reach.PROCESS: ("the script's process (env / argv) before it starts", "", None),
    Reach.GLOBAL: ("torch's global state when the script imports torch", "set when the script imports torch", None),
    Reach.LOADER: ("every DataLoader the script builds, over its own arguments",
                   "given to every DataLoader the script builds, over its own argument (each change is reported)",
                   "it built no torch.utils.data.DataLoader"),
    Reach.OPTIMIZER: ("every torch.optim optimizer the script builds, over its own argument",
                      "given to every torch.optim optimizer that has it, over the script's own argument (reported)",
                      "it built no torch.optim optimizer"),
    Reach.AUTOCAST: ("autocast around the forward of the outermost module with parameters",
                     "bf16 autocast around the forward of the outermost module with parameters",
                     "it called no module with parameters"),
    Reach.LAYOUT: ("the outermost module with 2-D convolutions and its 4-D inputs, in channels_last",
                   "the outermost module with 2-D convolutions converted to channels_last before its first forward, "
                   "its 4-D inputs at every call",
                   "it called no module with parameters"),
    Reach.DDP: ("every DistributedDataParallel the script builds, over its own argument",
                "given to every DistributedDataParallel the script builds, over its own argument (reported)",
                "it built no torch.nn.parallel.DistributedDataParallel (a job of one process, or another wrapper)"),
    Reach.COMPILE: ("the outermost module with parameters, compiled in place after the first backward()",
                    "the outermost module with parameters compiled in place after the script's first backward()",
                    "it called no module with trainable parameters before its first backward()"),
}


@dataclass(frozen=True)
class LaunchFlag:
    """The `torchpace launch` option a process-level knob takes its value from, declared on the knob
    (`Knob.launch_flag`): `cli/launch.py` makes the option from it, and the child planner hands its value to
    the knob's `plan_child` as `given` (cli > env > config > auto > default).

    Attributes:
        option: the option as typed (`--omp-threads`).
        help: its help text.
        choices: the words it takes (None: a whole number >= 1).
        or_auto: a whole number >= 1, or `auto` (the knob's own choice).
        metavar: how the help names its value (None: click's own).
    """

    option: str
    help: str
    choices: tuple[str, ...] | None = None
    or_auto: bool = False
    metavar: str | None = None

    @property
    def dest(self) -> str:
        """The option's parameter name, as click names it (`--omp-threads`: `omp_threads`)."""
        return self.option.lstrip("-").replace("-", "_")

    def parse(self, text: str) -> Any:
        """The option's value from its text (a whole-number option's as an int).

        Raises:
            ValueError: naming the value and what is valid.
        """
        if self.choices is not None:
            if text not in self.choices:
                raise ValueError(f"{text!r} is not valid; valid values: {', '.join(self.choices)}")
            return text
        if self.or_auto and text == "auto":
            return text
        if text.strip().isdigit() and int(text) >= 1:
            return int(text)
        auto = "'auto' or " if self.or_auto else ""
        raise ValueError(f"{text!r} is not {auto}a whole number >= 1")


class KnobSubject(Protocol):
    """What a knob's `applies`, `value_applies` and `candidates` read of the thing it is applied to: a
    `torchpace.workload.Workload`, or a `ScriptSubject` (None where that part is not known)."""

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> Any: ...

    @property
    def dataset(self) -> Any: ...

    @property
    def optimizer(self) -> Any: ...

    @property
    def is_training(self) -> bool: ...


@dataclass(frozen=True)
class ScriptSubject:
    """What the knobs see of code torchpace cannot look into: an unmodified script before it runs (no
    model, data or optimizer known yet), or one DataLoader it builds (only its `dataset`).

    `ranks_per_node`: the processes of the job on this node where its launcher's options say (`torchrun
    --nproc-per-node 2`), or a baseline measured them; None when unknown (one, or ranks the script starts itself)."""

    name: str
    model: Any = None
    dataset: Any = None
    optimizer: Any = None
    is_training: bool = True
    ranks_per_node: int | None = None


class ScriptHook(Protocol):
    """What the launch hook offers a knob inside an unmodified script's process (`Knob.apply_in_script`;
    `torchpace.script.inprocess` implements it)."""

    def enter_global(self, knob: "Knob", value: "KnobValue") -> None:
        """Apply a GLOBAL knob's set-and-restore context for the rest of the process."""

    def give_loaders(self, knob: "Knob", value: "KnobValue") -> None:
        """Give the value to every DataLoader the script builds (the knob's LOADER `apply` on its kwargs)."""

    def give_optimizers(self, knob: "Knob", value: "KnobValue") -> None:
        """Build every torch.optim optimizer that has the implementation `value` with it."""

    def autocast_forward(self, knob: "Knob", value: "KnobValue") -> None:
        """Run the outermost module's forward under the autocast `value` asks for."""

    def hold_threads(self, knob: "Knob", threads: int) -> None:
        """Keep the intra-op thread count the child's env set over the script's own
        `torch.set_num_threads()` calls (each change reported)."""

    def layout_forward(self, knob: "Knob", value: "KnobValue") -> None:
        """Put the outermost module with 2-D convolutions, and its 4-D inputs, in channels_last."""

    def compile_forward(self, knob: "Knob", value: "KnobValue") -> None:
        """Compile the outermost module in place, with the mode `value` names, after the script's first
        backward()."""

    def give_ddp(self, knob: "Knob", value: "KnobValue") -> None:
        """Give the value to every DistributedDataParallel the script builds, over its own argument."""


@dataclass(frozen=True)
class ApplyContext:
    """What `apply` may need besides its target."""

    host: "HostFacts"
    workload: "Workload"
    device: Any
    values: dict[str, KnobValue]
    dist: Any = None  # the process group of a distributed config (torchpace.engine.distributed.Dist)


class Knob:
    """Base of every knob. Subclasses set the class attributes and override what they need."""

    name: ClassVar[str]
    stage: ClassVar[str]
    point: ClassVar[Point]
    default: ClassVar[KnobValue]
    choices: ClassVar[tuple[KnobValue, ...] | None] = None
    help: ClassVar[str] = ""
    training_only: ClassVar[bool] = False
    script_reach: ClassVar[Reach | None] = None  # how it reaches an unmodified script; None: prepare() only
    # a `process` knob the script could still undo itself: how the launch hook keeps the value over the
    # script's own call (`apply_in_script` through the hook); None: nothing to keep
    script_guard: ClassVar[str | None] = None
    # the DataLoader argument a LOADER knob sets: a workload that gives it in `Workload.loader_options`
    # runs with its own value where a config does not set the knob (`default_for`)
    loader_argument: ClassVar[str | None] = None
    apply_order: ClassVar[int] = 50  # among the knobs of one point, lower applies first
    plan_order: ClassVar[int] = 50  # among the knobs planning a child process, lower plans first
    launch_flag: ClassVar[LaunchFlag | None] = None  # the `torchpace launch` option that sets its value
    # its gain depends on how many cores are free (threads, worker processes, ranks): a gain measured
    # while other processes held cores may not hold on a quiet host, and the other way round
    shares_cores: ClassVar[bool] = False

    def script_reason(self, value: KnobValue) -> str | None:
        """None when `value` reaches an unmodified script through the launch hook, else why not."""
        if self.script_reach is None:
            return f"{self.name} changes the model or the training step: it needs torchpace.prepare() in the script"
        return None

    def script_value(self, arguments: dict[str, Any]) -> KnobValue | None:
        """The value of this knob that an unmodified script's own `arguments` amount to (a DataLoader's or an
        optimizer's, the constructor's defaults filled in), before any knob changed them; None when they name
        none of its values (or it reaches no such arguments): the script's own setting, its baseline's."""
        return None

    def apply_in_script(self, value: KnobValue, hook: ScriptHook) -> None:
        """Take effect inside an unmodified script's process, the way `script_reach` says (a `process`
        knob already did, through the child's env and argv; one without a reach cannot)."""
        reach = self.script_reach
        if reach is Reach.GLOBAL:
            hook.enter_global(self, value)
        elif reach is Reach.LOADER:
            hook.give_loaders(self, value)
        elif reach is Reach.OPTIMIZER:
            hook.give_optimizers(self, value)
        elif reach is Reach.AUTOCAST:
            hook.autocast_forward(self, value)
        elif reach is Reach.LAYOUT:
            hook.layout_forward(self, value)
        elif reach is Reach.COMPILE:
            hook.compile_forward(self, value)
        elif reach is Reach.DDP:
            hook.give_ddp(self, value)

    def validate(self, value: Any) -> KnobValue:
        """Return `value` normalised, or raise UsageError naming the knob and the valid values."""
        if self.choices is not None:
            for choice in self.choices:
                if value == choice and type(value) is type(choice):
                    return choice
            raise UsageError(
                f"knob {self.name!r}: {value!r} is not valid; valid values: "
                + ", ".join(_fmt(c) for c in self.choices)
            )
        raise NotImplementedError(f"{type(self).__name__} must define choices or validate()")

    def applies(self, host: "HostFacts", workload: KnobSubject) -> str | None:
        """None when the knob applies, else the reason it does not."""
        if self.training_only and not workload.is_training:
            return "only for training workloads (this workload has no loss)"
        return None

    def default_for(self, workload: KnobSubject) -> KnobValue:
        """This knob's value on `workload` where a config does not set it: the workload's own DataLoader
        argument (`loader_argument` in `Workload.loader_options`) when it gives one, else `default`."""
        options = getattr(workload, "loader_options", None) or {}
        if self.loader_argument is not None and self.loader_argument in options:
            return self.validate(options[self.loader_argument])
        return self.default

    def candidates(self, host: "HostFacts", workload: KnobSubject) -> list[KnobValue]:
        """Values worth trying here, the default first (`default_for`: the workload's own, where it has one)."""
        default = self.default_for(workload)
        values = list(self.choices or [default])
        return [default] + [v for v in values if v != default and self.host_reason(v, host) is None
                            and self.value_applies(v, host, workload) is None]

    def value_applies(self, value: KnobValue, host: "HostFacts", workload: KnobSubject) -> str | None:
        """None when this particular value can run here, else why not (e.g. fp16 needs CUDA)."""
        return None

    def host_reason(self, value: KnobValue, host: "HostFacts") -> str | None:
        """None when `value` is within what this host allows whatever the workload, else why not
        (e.g. more DataLoader workers than the host's cores can run). Needs no workload, so every
        verb checks it, `launch` included."""
        return None

    def conflicts(self, values: dict[str, KnobValue]) -> str | None:
        """None when `values[self.name]` fits with the other knobs' values, else why not."""
        return None

    def companions(self, value: KnobValue) -> dict[str, KnobValue]:
        """Other knobs' values the tuner sets with `value` when the incumbent cannot take it alone
        (e.g. nproc_per_node = 2 comes with distributed.strategy = ddp)."""
        return {}

    def pointless(self, values: dict[str, KnobValue]) -> str | None:
        """Why a tuner need not try `values` (it runs, but cannot gain), or None."""
        return None

    def plan_child(self, value: KnobValue | None, given: Any, request: "ChildRequest",
                   draft: "ChildDraft") -> "ChildPart | None":
        """This knob's part of a child process's env and command, for a process-level knob; None (the
        default) for a knob that takes effect inside the process.

        Args:
            value: the config's value; None when the config does not set the knob.
            given: the command line's value (its `launch_flag`); None when not given.
            request: the host, the child's starting environment and the caller's policy.
            draft: what knobs of a lower `plan_order` decided (processes, NUMA bindings); a knob
                may record its own decision there for later knobs and the planner.

        Raises:
            UsageError: a value that cannot run here (a tool asked for is not installed).
        """
        return None

    def in_effect(self, value: KnobValue, host: "HostFacts") -> bool:
        """True when this process already runs with `value`'s process-level settings (always, for a
        knob that has none)."""
        return True

    def apply(self, value: KnobValue, target: Any, ctx: ApplyContext) -> Any:
        """Take effect on `target` (see the module docstring for each point); return the target."""
        return target

    def configure_step(self, value: KnobValue, options: Any, ctx: ApplyContext) -> None:
        """Set what `value` changes in how each step runs on `options` (runtime.prepare.StepOptions);
        called for every knob after all have applied. Nothing by default."""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "point": self.point.value,
            "default": self.default,
            "choices": list(self.choices) if self.choices is not None else None,
            "help": self.help,
        }


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class IntKnob(Knob):
    """A knob whose values are integers (with an optional named non-integer default like 'auto')."""

    minimum: ClassVar[int] = 0
    named: ClassVar[tuple[str, ...]] = ()

    def host_limit(self, host: "HostFacts") -> tuple[int, str] | None:
        """(the largest value this host allows, the rule that sets it), or None for no host bound."""
        return None

    def host_reason(self, value: KnobValue, host: "HostFacts") -> str | None:
        limit = self.host_limit(host)
        if limit is not None and isinstance(value, int) and value > limit[0]:
            return f"{value} is more than this host allows: at most {limit[0]} ({limit[1]})"
        return None

    def validate(self, value: Any) -> KnobValue:
        if isinstance(value, str) and value in self.named:
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= self.minimum:
            return value
        names = "".join(f" or {n!r}" for n in self.named)
        raise UsageError(f"knob {self.name!r}: {value!r} is not valid; expected an integer >= {self.minimum}{names}")
