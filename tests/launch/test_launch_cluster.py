"""`launch` on a scheduler allocation (`torchpace.launch.cluster`): under `srun` with one task per node, or in a
PyTorchJob pod, the nodes, this node's rank and the rendezvous come from the allocation; the command line's flags
win; a SLURM job of several nodes that cannot be one torchrun per node is refused (exit 2) naming the fix. The
allocations are SLURM's and the operator's environments as they write them (no scheduler runs here)."""

from __future__ import annotations

import json

import pytest

from torchpace.allocation import read_allocation
from torchpace.errors import UsageError
from torchpace.launch.cluster import rendezvous_of

STEP = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0"}


def test_an_srun_task_per_node_gets_the_nodes_its_rank_and_the_first_nodes_endpoint():
    rv = rendezvous_of(read_allocation(STEP))
    assert (rv.nnodes, rv.node_rank, rv.endpoint) == (2, 1, "n1:19242") and "job 4242" in rv.source
    pinned = rendezvous_of(read_allocation({**STEP, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29400"}))
    assert pinned.endpoint == "10.0.0.7:29400"  # the job's own MASTER_ADDR/PORT win


def test_one_node_a_rank_of_torchrun_and_no_allocation_derive_nothing():
    one = {**STEP, "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "1", "SLURM_NODEID": "0"}
    rank = {"TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "4", "RANK": "2"}
    assert [rendezvous_of(read_allocation(env)) for env in (one, rank, {})] == [None, None, None]


def test_a_pytorchjob_pod_is_one_node_of_the_job():
    pod = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    rv = rendezvous_of(read_allocation(pod))
    assert (rv.nnodes, rv.node_rank, rv.endpoint) == (3, 2, "job-master-0:23456") and "PyTorchJob" in rv.source


@pytest.mark.parametrize(("env", "says"), [
    ({k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}, "its batch script, which runs on the first node only"),
    ({**STEP, "SLURM_NTASKS": "8"}, "runs 8 tasks on 2 nodes"),
    ({k: v for k, v in STEP.items() if k not in ("SLURM_JOB_NODELIST", "SLURM_NODEID")}, "no SLURM_NODEID or no node list"),
])
def test_a_slurm_job_that_cannot_be_one_torchrun_per_node_is_refused_naming_the_fix(env, says):
    with pytest.raises(UsageError, match="srun|--rdzv-endpoint") as err:
        rendezvous_of(read_allocation(env))
    assert says in str(err.value)


def test_launch_derives_the_rendezvous_under_srun_and_the_flags_win(cli_run, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    done = cli_run("launch", "--dry-run", "--json", "--nproc-per-node", "1", "--", str(script), env_extra=STEP)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert "--nnodes=2" in plan["argv"] and "--rdzv-endpoint=n1:19242" in plan["argv"], plan["argv"]
    assert any("from the SLURM allocation (job 4242)" in note for note in plan["notes"])
    own = cli_run("launch", "--dry-run", "--json", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "0",
                  "--rdzv-endpoint", "10.1.1.1:29500", "--", str(script), env_extra=STEP)
    assert own.returncode == 0 and "--rdzv-endpoint=10.1.1.1:29500" in json.loads(own.stdout)["argv"]
    batch = cli_run("launch", "--dry-run", "--", str(script), env_extra={k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"})
    assert batch.returncode == 2 and "srun --ntasks-per-node=1 torchpace launch" in batch.stderr, batch.stderr
