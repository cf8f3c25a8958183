"""`launch` on a scheduler allocation: the nodes, this node's rank and the rendezvous, from the allocation itself.

Under `srun` with one task per node (the usual SLURM recipe: `srun --ntasks-per-node=1 torchpace launch
--nproc-per-node 8 -- train.py`) or in a Kubeflow PyTorchJob pod (one pod per node, `WORLD_SIZE` pods, this one
`RANK`), every node runs one `torchpace launch`, which runs torchrun for its local ranks; what torchrun's
`--nnodes`, `--node-rank` and `--rdzv-endpoint` would say is in the allocation (`torchpace.allocation`). The
command line's own flags win over it. Inside torchrun (a rank: torchelastic's variables) or on one node nothing
is derived. A SLURM job of several nodes that cannot be one torchrun per node is refused, naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchpace.allocation import KUBEFLOW, SLURM, Allocation
from torchpace.errors import UsageError


@dataclass(frozen=True)
class Rendezvous:
    """What an allocation says of a job of several nodes: torchrun's `--nnodes`, `--node-rank`, `--rdzv-endpoint`."""

    nnodes: int
    node_rank: int
    endpoint: str
    source: str  # in words: `the SLURM allocation (job 4242)`


def rendezvous_of(allocation: Allocation | None) -> Rendezvous | None:
    """The rendezvous `allocation` implies for a job of several nodes; None on one node or outside an allocation.

    Raises:
        UsageError: a SLURM job of several nodes that is not one task per node under `srun`, or whose rendezvous
            cannot be derived (no node list, no node index), naming what was found and what is needed.
    """
    if allocation is None:
        return None
    if allocation.scheduler == SLURM:
        return _slurm(allocation)
    if allocation.scheduler == KUBEFLOW and (allocation.tasks or 1) > 1:
        if allocation.rank is None or not allocation.master_addr or not allocation.master_port:
            raise UsageError("a PyTorchJob pod without RANK, MASTER_ADDR or MASTER_PORT: torchpace cannot derive the "
                             "rendezvous; give --nnodes, --node-rank and --rdzv-endpoint HOST:PORT")
        return Rendezvous(allocation.tasks, allocation.rank, f"{allocation.master_addr}:{allocation.master_port}",
                          f"the PyTorchJob's pods ({allocation.tasks}, this one RANK {allocation.rank})")
    return None


def _slurm(a: Allocation) -> Rendezvous | None:
    nodes = a.nodes or 1
    if nodes == 1:
        return None
    job = f"SLURM job {a.job_id}"
    if not a.under_srun:
        raise UsageError(f"{job} has {nodes} nodes, but this process is its batch script, which runs on the first node "
                         "only: start one torchpace launch per node with `srun --ntasks-per-node=1 torchpace launch ...`, "
                         "or give --nnodes, --node-rank and --rdzv-endpoint yourself")
    if a.tasks is not None and a.tasks != nodes:
        raise UsageError(f"{job} step runs {a.tasks} tasks on {nodes} nodes; torchpace launch starts torchrun, one per "
                         "node, which starts the node's ranks itself: run `srun --ntasks-per-node=1 torchpace launch "
                         "--nproc-per-node N ...`")
    if a.node_index is None or not a.master_addr or not a.master_port:
        raise UsageError(f"{job}: no SLURM_NODEID or no node list (SLURM_JOB_NODELIST) to derive the rendezvous from; "
                         "give --nnodes, --node-rank and --rdzv-endpoint HOST:PORT")
    return Rendezvous(nodes, a.node_index, f"{a.master_addr}:{a.master_port}", f"the SLURM allocation (job {a.job_id})")


__all__ = ["Rendezvous", "rendezvous_of"]
