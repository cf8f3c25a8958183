"""A profiled job of several ranks: each rank's trace, its share of the step in collectives, and the straggler's
wait (pure, over parsed traces).

In a synchronous job every rank waits in its collectives for the slowest: the rank that spends the least of its
step in them is the one the others wait for, and what the others spend beyond it is the wait it costs them
(`straggler_wait_us`). One trace per rank (`torchpace profile -- torchrun ...`: each rank traces the same steps),
read with `torchpace.profile.trace.parse_trace`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from torchpace.findings import Finding, Severity
from torchpace.profile.analyzers import is_collective
from torchpace.profile.trace import Trace, in_step_us

_WAIT_WARN_FRAC = 0.10  # a straggler that costs the others this share of their step is worth a warning


@dataclass(frozen=True)
class RankProfile:
    """One rank's traced steps.

    Attributes:
        rank: the rank.
        step_us: its mean traced step, in microseconds.
        comm_us_per_step: its time in collectives per step (on a GPU, the communication kernels).
        comm_frac: that share of its step.
        trace_path: where its trace was written (None when it was not kept).
    """

    rank: int
    step_us: float
    comm_us_per_step: float
    comm_frac: float
    trace_path: str | None = None

    def to_dict(self) -> dict:
        return {"rank": self.rank, "step_us": self.step_us, "comm_us_per_step": self.comm_us_per_step,
                "comm_frac": self.comm_frac, "trace_path": self.trace_path}

    @classmethod
    def from_dict(cls, data: Mapping) -> "RankProfile":
        return cls(int(data["rank"]), float(data["step_us"]), float(data["comm_us_per_step"]), float(data["comm_frac"]),
                   data.get("trace_path"))


def rank_profile(rank: int, trace: Trace, trace_path: str | None = None) -> RankProfile:
    """The figures of one rank's trace."""
    steps = trace.steps
    comm = [e for e in trace.events if is_collective(e)]
    kernels = [e for e in comm if e.cat == "kernel"]
    timed = kernels or comm  # on a GPU the kernels are the transfer; host-side calls only launch them
    comm_us = in_step_us(timed, steps) if timed and steps else 0.0
    total_us = trace.step_total_us if steps else 0.0
    per_step = comm_us / len(steps) if steps else 0.0
    return RankProfile(rank, total_us / len(steps) if steps else 0.0, per_step, comm_us / total_us if total_us else 0.0,
                       trace_path)


def straggler_wait_us(profiles: Sequence[RankProfile]) -> tuple[int, float] | None:
    """(the rank the others wait for, what they wait for it per step: the median of the other ranks' collective
    time per step beyond its own), None with fewer than two ranks."""
    if len(profiles) < 2:
        return None
    least = min(profiles, key=lambda p: p.comm_us_per_step)
    others = sorted(p.comm_us_per_step for p in profiles if p.rank != least.rank)
    middle = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
    return least.rank, max(0.0, middle - least.comm_us_per_step)


def ranks_finding(profiles: Sequence[RankProfile]) -> Finding | None:
    """`profile.ranks`: each rank's collective share and the straggler's wait (None for one rank)."""
    found = straggler_wait_us(profiles)
    if found is None:
        return None
    rank, wait_us = found
    step_us = sorted(p.step_us for p in profiles)[len(profiles) // 2]
    shares = " · ".join(f"{p.rank}: {p.comm_frac:.0%}" for p in sorted(profiles, key=lambda p: p.rank))
    share = wait_us / step_us if step_us else 0.0
    evidence = (f"collectives' share of each rank's step: {shares}; rank {rank} spends the least in them, so the others "
                f"wait for it about {wait_us / 1e3:.3g} ms per step ({share:.0%} of a step)")
    data = {"ranks": [p.to_dict() for p in profiles], "straggler": rank, "straggler_wait_us": wait_us,
            "straggler_wait_frac": share}
    if share >= _WAIT_WARN_FRAC:
        return Finding("profile.ranks", Severity.WARN, f"rank {rank} holds the others back", evidence,
                       area="distributed", data=data)
    return Finding("profile.ranks", Severity.INFO, "the ranks keep pace", evidence, area="distributed", data=data)
