"""A job of several processes, as one of its ranks sees it from inside its script: where the rank sits, the
collectives the measurement takes at each window's end, and the files the parent watches.

Every rank of a job runs the same `WindowMeter` (`torchpace.measure.timing`), agreed at window ends: when a
window is full (at the same step on every rank: windows are sized in steps, from times every rank shares),
each rank sends what it saw since the last window's end (its own time, samples, input wait, losses, peak
memory) to every other (`JobRanks.agree`, one `all_gather_object` over a gloo group of torchpace's own, made
beside the script's at the ranks' first step), and every rank takes the job's window from the same figures:
the samples of every rank over the time of the slowest. So every rank takes the same warm-up, window and
stopping decisions at the same step, and no rank ends while another waits for it in a collective: when the
meter is done every rank stops at that step, rank 0 writes the result, and all end together. Rank 0 also
keeps what every rank sent, so that a job that ends otherwise (the script finished first, a rank stalled or
died) is reported from what was agreed, with no collective left to take.

The parent (`torchpace.trial.script.JobWatch`) watches the files: RESULT.rankR, written by each rank at its
first step (its pid and host), and RESULT.rankR.failed, written by a rank whose script raised (its traceback),
so that a rank that fails ends the whole job at once, named, and never a hang.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from torchpace.files import OutputWriteFailed, write_atomic
from torchpace.measure.result import RankFigures
from torchpace.measure.timing import Window
from torchpace.script.spec import rank_failure_file, rank_file

# The collectives of torchpace's own group wait this long for a rank; a rank that hangs is found sooner by
# the stall watchdog (`torchpace.script.watch`), and one that died by its connections closing.
_COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
_REPLICA_RTOL = 1e-6  # DDP replicas' parameter sums this far apart (relative) have stopped training as one


class JobBroken(RuntimeError):
    """One of torchpace's collectives failed: a rank of the job is gone or stopped answering."""


@dataclass(frozen=True)
class RankPlace:
    """Where this process sits in the script's job (its default process group)."""

    rank: int
    world_size: int
    local_rank: int


def find_job() -> RankPlace | None:
    """This process's place in a job of several processes (the script initialised torch.distributed's default
    group with 2 or more ranks), else None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    if world < 2:
        return None
    rank = dist.get_rank()
    return RankPlace(rank, world, int(os.environ.get("LOCAL_RANK", rank)))


def launcher_world() -> tuple[int, int] | None:
    """(rank, world size) a launcher gave this process in its environment (torchrun's RANK and WORLD_SIZE), when
    it says 2 or more processes; None otherwise."""
    try:
        world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    except ValueError:
        return None
    return (rank, world) if world > 1 else None


@dataclass(frozen=True)
class RankSent:
    """What one rank sent at a window's end: its own view since the window before.

    Attributes:
        rank: the rank.
        arrived_s: when it reached this window's end, on the job's clock (seconds since the ranks' first
            agreement).
        own_s: its own time in the window: from leaving the previous window's agreement to reaching this one.
        steps, samples: its steps and samples in the window.
        wait_s: its seconds inside DataLoader `__next__` in the window.
        losses: its steps' losses in the window, in order.
        peak_bytes: its peak memory so far.
        backward_s: its seconds inside `backward()` in the window.
    """

    rank: int
    arrived_s: float
    own_s: float
    steps: int
    samples: int
    wait_s: float
    losses: tuple[float, ...] = ()
    peak_bytes: int = 0
    backward_s: float = 0.0


@dataclass
class RankMember:
    """A rank as it introduced itself at the first step: its pid, host and local rank."""

    rank: int
    pid: int
    host: str
    local_rank: int


class JobRanks:
    """The job's ranks, from one rank's side: torchpace's own gloo group over them, the agreed clock, and what
    every rank sent at each window's end (see the module docstring)."""

    def __init__(self, place: RankPlace, clock, result_path: str):
        import torch.distributed as dist

        self.place, self._clock, self.result_path = place, clock, result_path
        me = RankMember(place.rank, os.getpid(), socket.gethostname(), place.local_rank)
        write_atomic(rank_file(result_path, place.rank), json.dumps(asdict(me)))
        try:  # a collective of the default group: every rank makes it here, at its first step
            self.group = dist.new_group(backend="gloo", timeout=_COLLECTIVE_TIMEOUT)
        except Exception as err:  # a rank that is gone, or a backend that cannot make a gloo group
            raise JobBroken(f"the ranks could not form torchpace's measuring group: {err}") from err
        self.members = [RankMember(**m) for m in self._gather(asdict(me))]
        self.origin = clock()
        self.now = 0.0  # the job's clock: when the slowest rank reached the last agreement
        self._left_s = 0.0  # this rank's own time when it left the last agreement
        self.sent: list[list[RankSent]] = []  # per agreed window, every rank's `RankSent`
        self.measured: list[int] = []  # indices into `sent` of the measured windows

    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def world_size(self) -> int:
        return self.place.world_size

    @property
    def is_leader(self) -> bool:
        """Rank 0 writes the job's result."""
        return self.place.rank == 0

    @property
    def local_world_size(self) -> int:
        """Ranks of the job on this host."""
        host = socket.gethostname()
        return sum(1 for m in self.members if m.host == host)

    def clock(self) -> float:
        """The job's clock, as the ranks agreed it at the last window's end (the meter's clock)."""
        return self.now

    def _gather(self, payload: Any) -> list:
        import torch.distributed as dist

        gathered: list = [None] * self.place.world_size
        try:
            dist.all_gather_object(gathered, payload, group=getattr(self, "group", None))
        except Exception as err:  # a peer is gone, or stopped answering
            raise JobBroken(f"rank {self.place.rank} lost the other ranks while measuring: {err}") from err
        return gathered

    def agree(self, steps: int, samples: int, wait_s: float, losses: Sequence[float], peak_bytes: int,
              backward_s: float = 0.0) -> Window:
        """This rank's window ended after `steps` steps (the same on every rank): the job's window."""
        arrived = self._clock() - self.origin
        own = RankSent(self.place.rank, arrived, arrived - self._left_s, steps, samples, wait_s, tuple(losses), peak_bytes,
                       backward_s)
        sent = [RankSent(**s) for s in self._gather(asdict(own))]
        self._left_s = self._clock() - self.origin
        job_now = max(s.arrived_s for s in sent)
        window = Window(steps, sum(s.samples for s in sent), max(job_now - self.now, 1e-9))
        self.now = job_now
        self.sent.append(sent)
        return window

    def agree_flag(self, value: bool) -> bool:
        """True on every rank when `value` is True on every rank (e.g. each rank's compile is over)."""
        return all(self._gather(bool(value)))

    def mark_measured(self) -> None:
        """The latest agreed window was a measured one (not warm-up)."""
        self.measured.append(len(self.sent) - 1)

    def gather_final(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """Every rank's `payload` at the end (each rank calls this at the same step)."""
        return self._gather(payload)

    def barrier(self) -> None:
        self._gather(None)

    # ---- what rank 0 reports of the job, from what every rank sent ----------------------------------
    def step_losses(self) -> list[float]:
        """Each step's loss over the job: the mean over ranks of the ranks' losses at that step (the global
        batch's loss when the ranks' batches are alike), warm-up included."""
        per_rank: dict[int, list[float]] = {}
        for window in self.sent:
            for s in window:
                per_rank.setdefault(s.rank, []).extend(s.losses)
        curves = [curve for curve in per_rank.values() if curve]
        steps = min((len(c) for c in curves), default=0)
        return [sum(c[i] for c in curves) / len(curves) for i in range(steps)]

    def rank_figures(self) -> tuple[RankFigures, ...]:
        """Each rank over the measured windows, by its own clock (see `RankFigures`)."""
        figures = []
        for member in sorted(self.members, key=lambda m: m.rank):
            windows = [s for i in self.measured for s in self.sent[i] if s.rank == member.rank]
            own_s = sum(s.own_s for s in windows)
            rates = [s.steps / s.own_s for s in windows if s.own_s > 0]
            sample_rates = [s.samples / s.own_s for s in windows if s.own_s > 0 and s.samples]
            losses = [loss for s in windows for loss in s.losses]
            peak = max((s.peak_bytes for w in self.sent for s in w if s.rank == member.rank), default=0)
            figures.append(RankFigures(
                rank=member.rank, local_rank=member.local_rank, host=member.host, pid=member.pid,
                steps_per_s=statistics.median(rates) if rates else None,
                samples_per_s=statistics.median(sample_rates) if sample_rates else None,
                input_wait_frac=min(1.0, sum(s.wait_s for s in windows) / own_s) if own_s > 0 else None,
                backward_frac=min(1.0, sum(s.backward_s for s in windows) / own_s) if own_s > 0 else None,
                peak_memory_bytes=peak, mean_loss=sum(losses) / len(losses) if losses else None))
        return tuple(figures)

    def input_wait_frac(self) -> float | None:
        """The job's input-bound share: the ranks' mean share of their measured time spent waiting on a
        DataLoader (in a synchronous job every rank waits for the one whose batch is late)."""
        shares = [f.input_wait_frac for f in self.rank_figures() if f.input_wait_frac is not None]
        return sum(shares) / len(shares) if shares else None

    def peak_bytes(self) -> int:
        """The largest rank's peak memory."""
        return max((s.peak_bytes for w in self.sent for s in w), default=0)

    def rank_samples_per_step(self) -> list[int]:
        """Each rank's samples in its latest step with samples (from the last window), by rank."""
        last = self.sent[-1] if self.sent else []
        return [max(1, s.samples // max(1, s.steps)) for s in sorted(last, key=lambda s: s.rank) if s.samples]


def replica_fingerprint(modules: Sequence[Any]) -> list[float]:
    """A sum of the parameters of each DistributedDataParallel module the script built: equal on every rank
    while the replicas train as one."""
    import torch

    sums = []
    with torch.no_grad():
        for module in modules:
            total = torch.zeros((), dtype=torch.float64)
            for parameter in module.parameters():
                total += parameter.detach().double().sum().cpu()
            sums.append(float(total))
    return sums


def replicas_disagree(fingerprints: Sequence[Sequence[float]]) -> str | None:
    """Why the ranks' DDP replicas are no longer one model (their parameter sums differ), or None."""
    if not fingerprints or not fingerprints[0]:
        return None
    reference = fingerprints[0]
    for rank, sums in enumerate(fingerprints[1:], start=1):
        if len(sums) != len(reference):
            return f"rank {rank} holds {len(sums)} DistributedDataParallel model(s), rank 0 {len(reference)}"
        for index, (mine, theirs) in enumerate(zip(reference, sums)):
            if abs(mine - theirs) > _REPLICA_RTOL * max(1.0, abs(mine)):
                return (f"the ranks' DistributedDataParallel replicas differ after the measured steps (parameter sum "
                        f"of model {index}: rank 0 {mine:.9g}, rank {rank} {theirs:.9g}): they no longer train as one model")
    return None


def write_rank_failure(result_path: str, rank: int, world_size: int, exc: BaseException) -> None:
    """RESULT.rankR.failed: rank R's script raised `exc` (its traceback, and when), for the parent."""
    text = "".join(traceback.format_exception(exc))
    payload = {"rank": rank, "world_size": world_size, "pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}",
               "traceback": text[-4000:], "at": time.time()}
    try:
        write_atomic(rank_failure_file(result_path, rank), json.dumps(payload))
    except OutputWriteFailed:
        pass  # the parent still sees the rank end


__all__ = ["JobBroken", "JobRanks", "RankPlace", "RankSent", "find_job", "launcher_world", "replica_fingerprint",
           "replicas_disagree", "write_rank_failure"]
