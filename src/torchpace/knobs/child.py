"""What a process-level knob plans into a child process: the vocabulary of the child planner.

`torchpace.launch.plan.plan_child` is the one planner of a child's argv and env. It does not name
knobs: it asks every registered knob, in `Knob.plan_order`, for its part (`Knob.plan_child`), giving
it a `ChildRequest` (the host, the environment the child starts from, the caller's policy) and the
`ChildDraft` of what earlier knobs decided (how many processes, each rank's NUMA binding), and
joins the parts. Each `Setting` carries its value, its `Source` and the reason, with the precedence

    cli > env > config > auto > default

(`env`: a value the user already set in the environment they launch from; a trial's config wins
over it: `ChildRequest.config_over_env`). Pure: nothing here reads the machine or `os.environ`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from torchpace.host import HostFacts

KEPT = "already set in your environment; left as is"


class Source(str, enum.Enum):
    """Where a setting's value came from, highest precedence first."""

    CLI = "cli"
    ENV = "env"
    CONFIG = "config"
    AUTO = "auto"
    DEFAULT = "default"


@dataclass(frozen=True)
class Setting:
    """One decision of the plan.

    Attributes:
        name: an env var (`OMP_NUM_THREADS`), a limit (`RLIMIT_NOFILE`), a launch parameter
            (`nproc_per_node`, `numa`, `allocator`) or a knob the hook applies (`precision.matmul`).
        value: the value the child gets, as text; None when nothing is set.
        source: where the value came from.
        reason: why, in words a user can act on.
    """

    name: str
    value: str | None
    source: Source
    reason: str


@dataclass
class ChildPart:
    """What one planning step decides: settings, env changes (None removes a var), notes for the user."""

    settings: list[Setting] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RankBinding:
    """Where one local rank runs: its NUMA node and its own slice of that node's CPUs."""

    local_rank: int
    node: int
    cpus: tuple[int, ...]

    def numactl_prefix(self, numactl: str) -> list[str]:
        """`numactl --physcpubind=CPUS --membind=NODE`: CPUs and memory on the node."""
        return [numactl, f"--physcpubind={format_cpu_list(self.cpus)}", f"--membind={self.node}"]


@dataclass(frozen=True)
class ChildRequest:
    """What every process-level knob plans from (the same for all of them).

    Attributes:
        host: this machine's facts (cores, NUMA nodes, GPUs, allocators, numactl).
        base_env: the environment the child starts from (never modified).
        config_name: how messages name the config (`torchpace.toml`).
        auto: settings that neither the cli nor the config decides take torchpace's own choice.
        config_over_env: the config's values win over variables already set in `base_env` (a trial).
        allowed_cpus: CPUs this process may run on; None when unknown.
        install_command: tool name (`jemalloc`, `numactl`) -> the command that installs it here.
    """

    host: "HostFacts"
    base_env: Mapping[str, str]
    config_name: str
    auto: bool
    config_over_env: bool
    allowed_cpus: frozenset[int] | None
    install_command: Callable[[str], str]

    def wants_auto(self, given: object) -> bool:
        """Whether a setting whose cli option is `given` takes torchpace's own auto choice."""
        return given == "auto" or (given is None and self.auto)

    def env_wins_note(self, what: str, tuned: str, variable: str) -> str:
        """A note that the caller's environment (`what`) overrides the config's `tuned` value."""
        return (f"{what} in your environment wins over {tuned} in {self.config_name}, so the script does not run "
                f"as it was tuned; unset {variable} (or pass the option) to run the tuned value")


@dataclass
class ChildDraft:
    """What the knobs planned so far that later knobs and the planner read.

    Attributes:
        nproc: processes per node that torchpace starts (`nproc_per_node`, planned first).
        multi_node: the cli asked for several nodes or a rendezvous endpoint.
        bindings: each local rank's NUMA binding (empty when not binding).
        launcher: the launcher the user's command runs itself (`torchrun`, `accelerate launch`), which starts
            its own ranks; None for a program that runs directly.
        launcher_ranks: the processes that launcher starts on this node, where its options say.
    """

    nproc: int = 1
    multi_node: bool = False
    bindings: tuple[RankBinding, ...] = ()
    launcher: str | None = None
    launcher_ranks: int | None = None

    @property
    def ranks(self) -> int:
        """Processes of the job on this node: the user's launcher's, else torchpace's."""
        return self.launcher_ranks or self.nproc

    @property
    def torchrun(self) -> bool:
        """Whether torchrun runs the program (several processes, or several nodes)."""
        return self.nproc > 1 or self.multi_node


def env_part(wanted: Mapping[str, str], source: Source, reason: str, base_env: Mapping[str, str],
             over_env: bool = False) -> ChildPart:
    """Settings for env vars: a var the user already set wins unless the value comes from the cli
    (or `over_env`: a trial's config value)."""
    part = ChildPart()
    for name, value in wanted.items():
        if name in base_env and source is not Source.CLI and not over_env:
            part.settings.append(Setting(name, base_env[name], Source.ENV, KEPT))
        else:
            part.settings.append(Setting(name, value, source, reason))
            part.env[name] = value
    return part


def merge_parts(*parts: ChildPart) -> ChildPart:
    """One part holding the settings, env changes and notes of `parts`, in order."""
    merged = ChildPart()
    for part in parts:
        merged.settings += part.settings
        merged.env.update(part.env)
        merged.notes += part.notes
    return merged


def format_cpu_list(cpus: Sequence[int]) -> str:
    """`(0, 1, 2, 3, 8)` -> `"0-3,8"`, the kernel's and numactl's CPU list syntax."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
