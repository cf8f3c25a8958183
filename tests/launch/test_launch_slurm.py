"""`torchpace launch` and `doctor` on a real two-node SLURM cluster (tests/_slurm.py: munged, slurmctld and one slurmd
per node on this host): what SLURM itself writes into a job step's environment is what torchpace reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parents[1] / "script" / "scripts"


def _srun(slurm, *argv, extra_env=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC", "MASTER_", "PYTEST_XDIST"))}
    env.update(slurm.env, **(extra_env or {}))
    return subprocess.run(["srun", "-N2", "--ntasks-per-node=1", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_doctor_in_a_job_step_sees_the_allocation_srun_gave_it(slurm, tmp_path):
    done = _srun(slurm, f"--output={tmp_path}/doctor.%t.json", sys.executable, "-m", "torchpace", "doctor", "--json")
    outputs = sorted(tmp_path.glob("doctor.*.json"))
    assert len(outputs) == 2, (done.returncode, done.stderr[-2000:])
    reports = [json.loads(path.read_text()) for path in outputs]
    records = sorted((next(f for f in r["findings"] if f["id"] == "cluster.allocation")["data"] for r in reports),
                     key=lambda d: d["node_index"])
    assert [(d["node_index"], d["nodes"], d["tasks"], d["under_srun"]) for d in records] == [(0, 2, 2, True), (1, 2, 2, True)]
    assert all(d["hosts"] == ["n1", "n2"] and d["master_addr"] == "n1" for d in records)


def test_launch_under_srun_runs_one_ddp_job_across_both_nodes_without_rendezvous_flags(slurm, tmp_path):
    report = tmp_path / "seen.json"
    # the nodes are this host: its rendezvous address is the loopback (the job's own MASTER_ADDR wins over
    # the first node's name); the port is derived from the job id
    done = _srun(slurm, sys.executable, "-m", "torchpace", "launch", "--nproc-per-node", "1", "--",
                 str(SCRIPTS / "ddp_probe.py"), str(report), "3", extra_env={"MASTER_ADDR": "127.0.0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("from the SLURM allocation (job ") == 2  # each node's launch says where it came from
    seen = [json.loads(Path(f"{report}.rank{rank}").read_text()) for rank in range(2)]
    assert [s["world_size"] for s in seen] == [2, 2]  # one job of two ranks, one on each node
    assert all(verdict == "ok" for s in seen for verdict in s["after"].values()), seen
