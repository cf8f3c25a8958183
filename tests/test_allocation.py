"""The scheduler allocation read from a process's environment (`torchpace.allocation`): SLURM's variables as its
`srun` and `sbatch` set them (the environments below are what SLURM 22.05 writes, trimmed), torchelastic's,
Kubeflow's PyTorchJob's, LSF's; SLURM's node lists expanded as `scontrol show hostnames` expands them."""

from __future__ import annotations

import pytest

from torchpace.allocation import KUBEFLOW, LSF, SLURM, TORCHELASTIC, expand_nodelist, read_allocation
from torchpace.errors import UsageError

SRUN_TASK = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
             "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
             "SLURM_CPUS_PER_TASK": "16", "SLURM_STEP_GPUS": "0,1,2,3", "SLURM_MEM_PER_NODE": "65536",
             "SLURM_STEP_ID": "0"}


@pytest.mark.parametrize(("text", "hosts"), [
    ("node01", ("node01",)),
    ("node[01-03,07]", ("node01", "node02", "node03", "node07")),
    ("node[01-04,07],gpu1", ("node01", "node02", "node03", "node04", "node07", "gpu1")),
    ("n[8-11]", ("n8", "n9", "n10", "n11")),  # no padding: the numbers as they are
    ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    ("a-b.c[009-010]-ib", ("a-b.c009-ib", "a-b.c010-ib")),
])
def test_a_node_list_expands_as_slurm_expands_it(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(("text", "why"), [("node[01-03", "without its ']'"), ("node]1[", "without its '['"),
                                           ("node[a-c]", "not a number or a range"), ("node[5-2]", "runs backwards"),
                                           ("n1,,n2", "an empty host name"), ("n 1", "no host name")])
def test_a_node_list_that_is_not_slurms_is_refused_naming_what_is_valid(text, why):
    with pytest.raises(UsageError, match="cannot read the SLURM node list") as err:
        expand_nodelist(text)
    assert why in str(err.value) and "node[01-04,07]" in str(err.value)


def test_a_task_that_srun_started_has_the_whole_record():
    a = read_allocation(SRUN_TASK)
    assert (a.scheduler, a.job_id, a.nodes, a.node_index, a.hosts) == (SLURM, "4242", 2, 1, ("gpu07", "gpu08"))
    assert (a.tasks, a.rank, a.local_rank, a.cpus_per_task) == (2, 1, 0, 16)
    assert a.gpus == ("0", "1", "2", "3") and a.memory_limit_bytes == 64 * 2**30 and a.under_srun
    # the rendezvous it implies, as Lightning derives it: the first host, 15000 + the job id's last 4 digits
    assert (a.master_addr, a.master_port) == ("gpu07", 15000 + 4242)
    assert not a.interactive and a.to_dict()["hosts"] == ["gpu07", "gpu08"]


def test_the_batch_script_itself_is_not_under_srun_and_its_own_rendezvous_wins():
    batch = {k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_ID"}
    a = read_allocation({**batch, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "SLURM_JOB_NAME": "bash"})
    assert a.under_srun is False and (a.master_addr, a.master_port) == ("10.0.0.5", 29500) and a.interactive


def test_counts_slurm_repeats_are_read_and_a_count_that_is_none_is_refused():
    assert read_allocation({"SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "4(x2)"}).cpus_per_task == 4
    with pytest.raises(UsageError, match="SLURM_NTASKS='two' is not a count"):
        read_allocation({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "two"})


def test_torchrun_kubeflow_and_lsf_are_read_and_nothing_is_none():
    rank = {"MASTER_ADDR": "trainer-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "3"}
    elastic = read_allocation({**rank, "TORCHELASTIC_RUN_ID": "abc", "GROUP_RANK": "1", "LOCAL_RANK": "1"})
    assert (elastic.scheduler, elastic.node_index, elastic.tasks, elastic.rank, elastic.local_rank) == (TORCHELASTIC, 1, 4, 3, 1)
    pod = read_allocation(rank)  # a PyTorchJob pod: the operator's variables without torchelastic's
    assert (pod.scheduler, pod.master_addr, pod.master_port, pod.tasks, pod.rank) == (KUBEFLOW, "trainer-master-0", 23456, 4, 3)
    lsf = read_allocation({"LSB_JOBID": "99", "LSB_JOBNAME": "train", "LSB_MCPU_HOSTS": "hostA 8 hostB 8"})
    assert (lsf.scheduler, lsf.hosts, lsf.nodes, lsf.tasks, lsf.master_addr) == (LSF, ("hostA", "hostB"), 2, 16, "hostA")
    assert read_allocation({"PATH": "/usr/bin", "RANK": "0"}) is None
