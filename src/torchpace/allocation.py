"""The scheduler allocation this process runs in, read from its environment (pure, standard library only).

One record for what SLURM, torchelastic (torchrun), Kubeflow's PyTorchJob and LSF tell a process: the job, its
nodes and this node's index, its tasks and this task's rank, the cores per task, the GPUs bound to the step, the
memory limit, whether `srun` started this process, and the rendezvous the allocation implies (the first host of the
node list and a port derived from the job id, as PyTorch Lightning derives them). `doctor` shows it with verdicts.

The variables read, by scheduler (the first that applies wins):

- SLURM: `SLURM_JOB_ID`, `SLURM_JOB_NAME`, `SLURM_JOB_NUM_NODES` (or `SLURM_NNODES`), `SLURM_NODEID`,
  `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`), `SLURM_NTASKS`, `SLURM_PROCID`, `SLURM_LOCALID`,
  `SLURM_CPUS_PER_TASK`, `SLURM_STEP_GPUS` / `SLURM_JOB_GPUS`, `SLURM_MEM_PER_NODE` (MB), `SLURM_STEP_ID`
  (set only inside a job step, i.e. under `srun`);
- torchelastic: `TORCHELASTIC_RUN_ID`, `GROUP_RANK`, `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, `MASTER_ADDR`/`PORT`;
- Kubeflow PyTorchJob: `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `RANK` without torchelastic's variables
  (the operator sets them per pod; `PET_NNODES` when it runs torchrun in the pod);
- LSF: `LSB_JOBID`, `LSB_JOBNAME`, `LSB_MCPU_HOSTS` (host, slots pairs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from torchpace.errors import UsageError

SLURM, TORCHELASTIC, KUBEFLOW, LSF = "slurm", "torchelastic", "kubeflow", "lsf"
INTERACTIVE_JOB_NAMES = frozenset({"bash", "sh", "zsh", "interactive", "jupyter"})
_PORT_BASE = 15000  # PyTorch Lightning's SLURM port: 15000 + the job id's last four digits
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class Allocation:
    """What the scheduler gave this process (None where it does not say).

    Attributes:
        scheduler: `slurm`, `torchelastic`, `kubeflow` or `lsf`.
        job_id, job_name: the scheduler's job.
        nodes, node_index: the job's node count and this node's index in it.
        hosts: the job's hosts, in the scheduler's order (a SLURM node list expanded).
        tasks, rank, local_rank: the job's task count (the world size) and this task's ranks.
        cpus_per_task: the cores each task was given (`SLURM_CPUS_PER_TASK`).
        gpus: the GPU indices bound to the job step, as the scheduler lists them.
        memory_limit_bytes: the memory limit per node.
        under_srun: SLURM: this process runs inside a job step (started by `srun`), not in the batch script itself.
        master_addr, master_port: the rendezvous the allocation implies (its own variables, else derived).
    """

    scheduler: str
    job_id: str | None = None
    job_name: str | None = None
    nodes: int | None = None
    node_index: int | None = None
    hosts: tuple[str, ...] = ()
    tasks: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    cpus_per_task: int | None = None
    gpus: tuple[str, ...] | None = None
    memory_limit_bytes: int | None = None
    under_srun: bool | None = None
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def interactive(self) -> bool:
        """A job whose name marks an interactive shell (`salloc` then `bash`, `srun --pty bash`)."""
        return (self.job_name or "").lower() in INTERACTIVE_JOB_NAMES

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(hosts=list(self.hosts), gpus=list(self.gpus) if self.gpus is not None else None,
                    interactive=self.interactive)
        return data


def expand_nodelist(text: str) -> tuple[str, ...]:
    """SLURM's compressed host list, expanded: `node[01-03,07],gpu1` -> node01 node02 node03 node07 gpu1.

    Ranges keep their zero padding; several bracket groups in one name multiply (`r[1-2]n[1-2]`).

    Raises:
        UsageError: a list that is not SLURM's host-list syntax, quoted with what is valid.
    """
    hosts: list[str] = []
    for item in _split_top_level(text.strip(), text):
        hosts.extend(_expand_one(item, text))
    return tuple(hosts)


def _split_top_level(text: str, whole: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _bad_nodelist(whole, "a ']' without its '['")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise _bad_nodelist(whole, "a '[' without its ']'")
    items.append(text[start:])
    if any(not item for item in items):
        raise _bad_nodelist(whole, "an empty host name")
    return items


def _expand_one(item: str, whole: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", item):
            raise _bad_nodelist(whole, f"{item!r} is no host name")
        return [item]
    prefix, suffix = item[:match.start()], item[match.end():]
    expanded = []
    for part in match.group(1).split(","):
        bounds = _RANGE.match(part.strip())
        if bounds is None:
            raise _bad_nodelist(whole, f"[{match.group(1)}] holds {part!r}, not a number or a range N-M")
        low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
        if int(high) < int(low):
            raise _bad_nodelist(whole, f"the range {part!r} runs backwards")
        width = len(low) if low.startswith("0") else 0
        expanded.extend(f"{prefix}{n:0{width}d}" for n in range(int(low), int(high) + 1))
    return [host for name in expanded for host in _expand_one(name + suffix, whole)]


def _bad_nodelist(text: str, why: str) -> UsageError:
    return UsageError(f"cannot read the SLURM node list {text!r}: {why}; a node list is host names and "
                      "bracketed ranges separated by commas, e.g. node[01-04,07],gpu1")


def read_allocation(env: Mapping[str, str]) -> Allocation | None:
    """The allocation `env` describes, or None outside any scheduler.

    Raises:
        UsageError: a variable the record needs holds what the scheduler never writes (a node list or a count
            that cannot be read), naming it.
    """
    if env.get("SLURM_JOB_ID"):
        return _slurm(env)
    if env.get("TORCHELASTIC_RUN_ID"):
        return _rendezvous(env, TORCHELASTIC, nodes=_int(env, "PET_NNODES") or None, node_index=_int(env, "GROUP_RANK"))
    if env.get("MASTER_ADDR") and env.get("WORLD_SIZE") and env.get("RANK"):
        return _rendezvous(env, KUBEFLOW, nodes=_int(env, "PET_NNODES") or None, node_index=None)
    if env.get("LSB_JOBID"):
        return _lsf(env)
    return None


def _slurm(env: Mapping[str, str]) -> Allocation:
    job_id = env["SLURM_JOB_ID"]
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    hosts = expand_nodelist(nodelist) if nodelist else ()
    gpus = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    memory_mb = _int(env, "SLURM_MEM_PER_NODE")
    digits = re.sub(r"\D", "", job_id)
    return Allocation(
        SLURM, job_id=job_id, job_name=env.get("SLURM_JOB_NAME"),
        nodes=_int(env, "SLURM_JOB_NUM_NODES") or _int(env, "SLURM_NNODES") or (len(hosts) or None),
        node_index=_int(env, "SLURM_NODEID"), hosts=hosts, tasks=_int(env, "SLURM_NTASKS"), rank=_int(env, "SLURM_PROCID"),
        local_rank=_int(env, "SLURM_LOCALID"), cpus_per_task=_int(env, "SLURM_CPUS_PER_TASK"),
        gpus=tuple(g for g in gpus.split(",") if g) if gpus else None,
        memory_limit_bytes=memory_mb * 1024 * 1024 if memory_mb else None,
        under_srun=bool(env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")),
        master_addr=env.get("MASTER_ADDR") or (hosts[0] if hosts else None),
        master_port=_int(env, "MASTER_PORT") or (_PORT_BASE + int(digits[-4:]) if digits else None))


def _rendezvous(env: Mapping[str, str], scheduler: str, nodes: int | None, node_index: int | None) -> Allocation:
    return Allocation(scheduler, job_id=env.get("TORCHELASTIC_RUN_ID"), nodes=nodes, node_index=node_index,
                      tasks=_int(env, "WORLD_SIZE"), rank=_int(env, "RANK"), local_rank=_int(env, "LOCAL_RANK"),
                      master_addr=env.get("MASTER_ADDR"), master_port=_int(env, "MASTER_PORT"))


def _lsf(env: Mapping[str, str]) -> Allocation:
    words = env.get("LSB_MCPU_HOSTS", "").split()
    hosts = tuple(words[0::2])
    slots = [int(n) for n in words[1::2] if n.isdigit()]
    return Allocation(LSF, job_id=env["LSB_JOBID"], job_name=env.get("LSB_JOBNAME"), nodes=len(hosts) or None,
                      hosts=hosts, tasks=sum(slots) or None, master_addr=hosts[0] if hosts else None)


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    text = raw.split("(")[0].strip()  # SLURM writes repeated counts as `4(x2)`
    if not text.isdigit():
        raise UsageError(f"{name}={raw!r} is not a count; the scheduler writes a whole number there")
    return int(text)


__all__ = ["Allocation", "SLURM", "TORCHELASTIC", "KUBEFLOW", "LSF", "expand_nodelist", "read_allocation"]
