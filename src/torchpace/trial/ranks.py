"""Trials of several processes: `nproc_per_node > 1` runs the trial child under torchrun.

Parent side: the child planner (`torchpace.launch.plan.plan_child`, through `runner.plan_trial`) makes
the child's command `python -m torchpace.launch.torchrun --nproc-per-node=N --standalone -m torchpace.trial
SPEC RESULT` (through `torchpace.launch.bind` when the ranks are NUMA-bound), and when it fails, `read_rank_failure` names the
rank that failed first and returns its result and stderr.

Child side (each rank): `enter_rank` makes the rank die with torchrun and sends its stderr to its own
file; rank 0 writes RESULT.json; a rank whose workload raised writes `result.rankN.json` beside it
(with the time it failed) and exits with `RECORDED_EXIT`, so torchrun stops the other ranks (which would wait
in a collective for it forever) at once.

Which rank failed first: a rank that ended without writing its result (a segfault, `os._exit`) cannot
be the echo of another rank's failure, so it is the cause; otherwise the earliest recorded failure
(the other ranks' errors are their collectives losing a peer); ranks that torchrun stopped
(SIGTERM / SIGKILL) are never the cause.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from torchpace.launch.torchrun import parse_failures
from torchpace.process import die_with_parent
from torchpace.protocol import CRASH, TrialResult, classify_exit

RECORDED_EXIT = 3  # a rank whose workload raised: its result file says why
_STOPPED_BY_TORCHRUN = (-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGKILL)
_RANK_TAIL_BYTES = 3000


def rank_file(result_path: Path, rank: int, kind: str) -> Path:
    """`result.rank1.json` / `stderr.rank1.txt` next to RESULT.json."""
    return result_path.with_name(f"result.rank{rank}.json" if kind == "result" else f"stderr.rank{rank}.txt")


# ---- child side ---------------------------------------------------------------------------------
def enter_rank(result_path: Path, rank: int) -> None:
    """In a rank process: die with torchrun (even on its SIGKILL), and write stderr to this rank's file."""
    die_with_parent()
    err = os.open(rank_file(result_path, rank, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    os.dup2(err, 2)
    os.close(err)


def record_rank_failure(result: TrialResult, result_path: Path, rank: int) -> None:
    """Write a failed rank's result (with when it failed) and end the process at once."""
    payload = {**result.to_dict(), "failed_rank": rank, "failed_at": time.time()}
    rank_file(result_path, rank, "result").write_text(json.dumps(payload))
    sys.stderr.flush()
    os._exit(RECORDED_EXIT)  # no atexit: a process group torn down mid-collective can hang on exit


# ---- parent side --------------------------------------------------------------------------------
def read_rank_failure(result_path: Path, torchrun_stderr: str, returncode: int, wall_s: float) -> TrialResult:
    """The result of a multi-process trial that failed: the first failing rank's, with its stderr."""
    exits = parse_failures(torchrun_stderr)  # rank -> exit code (negative: signal)
    recorded = {}
    for path in result_path.parent.glob("result.rank*.json"):
        data = json.loads(path.read_text())
        recorded[int(data["failed_rank"])] = data
    hard = sorted(r for r, code in exits.items() if r not in recorded and code not in _STOPPED_BY_TORCHRUN and code != 0)
    if hard:
        rank = hard[0]
        tail = rank_stderr(result_path, rank)
        how = f"signal {-exits[rank]}" if exits[rank] < 0 else f"exit status {exits[rank]}"
        return TrialResult(classify_exit(exits[rank], tail),
                           error=f"rank {rank} ended without a result ({how})", stderr_tail=tail,
                           returncode=returncode, wall_time_s=wall_s, failed_rank=rank)
    if recorded:
        rank, data = min(recorded.items(), key=lambda item: item[1]["failed_at"])
        data = {k: v for k, v in data.items() if k != "failed_at"}
        data.update(error=f"rank {rank}: {data.get('error', '')}", stderr_tail=rank_stderr(result_path, rank),
                    returncode=returncode, wall_time_s=wall_s)
        return TrialResult.from_dict(data)
    return TrialResult(CRASH, error=f"torchrun ended with exit status {returncode} and no rank recorded why",
                       stderr_tail=all_ranks_stderr(result_path) + torchrun_stderr[-_RANK_TAIL_BYTES:],
                       returncode=returncode, wall_time_s=wall_s)


def rank_stderr(result_path: Path, rank: int) -> str:
    path = rank_file(result_path, rank, "stderr")
    data = path.read_bytes() if path.exists() else b""
    return data[-_RANK_TAIL_BYTES:].decode(errors="replace")


def all_ranks_stderr(result_path: Path) -> str:
    """Each rank's stderr tail, headed by its rank (for a hang, where no rank says it failed)."""
    ranks = sorted(int(p.name[len("stderr.rank"):-len(".txt")]) for p in result_path.parent.glob("stderr.rank*.txt"))
    return "".join(f"--- rank {rank} ---\n{rank_stderr(result_path, rank)[-_RANK_TAIL_BYTES // 2:]}\n" for rank in ranks)
