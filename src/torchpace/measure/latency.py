"""Per-call latency at batch 1: warm up, then time single calls until the median's CI is tight.

Method: latency is a property of ONE request, so unlike throughput (windows of many steps, synced
only at window ends) every call is timed on its own and the device is synchronised after each call
(on CPU the sync is a no-op). Warm-up follows the throughput meter's rule (`torchpace.measure.timing`):
the first call always runs and never counts (torch.compile compiles a batch-1 graph there), then
warm-up continues until two consecutive blocks of calls agree (`stats.windows_agree`, within the
meter's `WARMUP_TOLERANCE`; a block's figure is the median of its calls, as single calls jitter more
than windows) or its deadline passes (not converged). Measured calls then run until there are at least `min_calls` and the 95%
confidence interval of the median (binomial order statistics, as for throughput; past
`_EXACT_RANKS_MAX_N` calls the binomial's normal approximation gives the ranks) is within
±`target_ci_rel`, or the deadline passes. p90 and p99 are nearest-rank percentiles of the measured
calls: with fewer than 100 calls p99 is simply the slowest call.

In a paired comparison under the latency objective (`torchpace.trial.pair`) the meter takes turns with
another trial through a `torchpace.measure.gate.Gate`, as the throughput meter does: it stops before its
first call and when its warm-up is over, then times single calls for one turn at a time (of the gate's
`turn_s`, at the whole calls nearest it, the first `turn_lead_in` of it untimed), and reports each turn's
figure as `rate`: calls per second at that turn's median call (1 / its p50), the latency objective's score.
The parent, which compares the two arms round by round on those figures, says when to end; the percentiles
are then those of every call timed in a turn.

The clock, the call and the sync are injected, so the loop is tested with a scripted clock.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from torchpace.measure.gate import GO, LOADED, READY, WINDOW, Gate, GateEvent
from torchpace.measure.stats import median_ci_ranks, windows_agree
from torchpace.measure.timing import WARMUP_TOLERANCE, Clock, TimingOptions, turn_full

_WARMUP_BLOCK_CALLS = 5  # medians of blocks of this many calls must agree to end the warm-up
_CI_CHECK_GROWTH = 1.1  # recompute the CI each time the sample grows by 10% (sorting is not free)
_EXACT_RANKS_MAX_N = 100  # exact binomial ranks up to here; their cost grows with n squared
_Z_95 = 1.959964


@dataclass(frozen=True)
class LatencyOptions:
    """Knobs of the latency measurement itself."""

    warmup_tolerance: float = WARMUP_TOLERANCE
    target_ci_rel: float = 0.02
    min_calls: int = 200
    max_calls: int = 20_000
    max_warmup_calls: int = 200


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles of per-call latency in seconds, with the 95% CI of the median (p50)."""

    n: int
    p50_s: float
    p90_s: float
    p99_s: float
    p50_ci_low_s: float
    p50_ci_high_s: float
    ci_coverage: float

    @property
    def ci_rel_halfwidth(self) -> float:
        """Half the p50 CI width relative to p50 (0.02 means ±2%)."""
        return (self.p50_ci_high_s - self.p50_ci_low_s) / 2 / self.p50_s if self.p50_s else math.inf


def percentile_nearest_rank(ordered: list[float], q: float) -> float:
    """The nearest-rank `q`-quantile (0 < q <= 1) of already sorted values: the ceil(q*n)-th smallest."""
    if not ordered:
        raise ValueError("need at least one value")
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def median_ci_ranks_large(n: int) -> tuple[int, int, float]:
    """0-based ranks bounding the median with ~95% coverage: exact for small n, else from the
    normal approximation of Binomial(n, 1/2) (rank n/2 ± 1.96 * sqrt(n) / 2, widened outward)."""
    if n <= _EXACT_RANKS_MAX_N:
        return median_ci_ranks(n)
    half_width = _Z_95 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half_width) - 1)
    hi = min(n - 1, math.ceil(n / 2 + half_width))
    return lo, hi, 0.95


def summarize_latency(values_s: list[float]) -> LatencySummary:
    """p50 (median) with its order-statistic 95% CI, p90 and p99 of per-call latencies in seconds."""
    ordered = sorted(values_s)
    lo, hi, coverage = median_ci_ranks_large(len(ordered))
    return LatencySummary(len(ordered), statistics.median(ordered), percentile_nearest_rank(ordered, 0.90),
                          percentile_nearest_rank(ordered, 0.99), ordered[lo], ordered[hi], coverage)


@dataclass(frozen=True)
class Latency:
    """The outcome of one latency measurement."""

    calls_s: tuple[float, ...]
    summary: LatencySummary
    warmup_s: float
    warmup_calls: int
    warmup_converged: bool
    stopped_by: str  # "ci" (target met), "time" (deadline passed), "calls" (max_calls reached), "pair" (turns ended)


def time_call(call: Callable[[], object], clock: Clock, sync: Callable[[], None]) -> float:
    """Seconds one call takes, device work included (synchronised after the call)."""
    start = clock()
    call()
    sync()
    return clock() - start


def _warm_up(call, clock, sync, options: LatencyOptions, deadline: float) -> tuple[int, bool, float]:
    """Run calls until two consecutive blocks agree; returns (warm-up calls, converged, the last block's median
    call in seconds, else the first call's)."""
    block = time_call(call, clock, sync)  # always runs: compile / lazy initialisation happen here
    calls, previous = 1, None
    while calls < options.max_warmup_calls and clock() < deadline:
        block = statistics.median(time_call(call, clock, sync) for _ in range(_WARMUP_BLOCK_CALLS))
        calls += _WARMUP_BLOCK_CALLS
        if previous is not None and windows_agree(block, previous, options.warmup_tolerance):
            return calls, True, block
        previous = block
    return calls, False, block


def measure_latency(call: Callable[[], object], clock: Clock, sync: Callable[[], None], options: LatencyOptions,
                    warmup_deadline: float, deadline: float, gate: Gate | None = None) -> Latency:
    """Warm up, then time single calls of `call` (one batch-1 request each). See the module docstring.

    Args:
        warmup_deadline: clock time after which warm-up stops (flagged as not converged).
        deadline: clock time after which no new call starts (at least one call is measured); with a `gate`
            the parent ends the turns instead.
        gate: take turns with another trial (a paired comparison under the latency objective); `clock` is
            then `gate.clock`.

    Raises:
        ValueError: with a `gate`, the parent ended the comparison before any turn of this arm's.
    """
    if gate is not None and gate.pause(GateEvent(LOADED)) != GO:
        raise ValueError("the comparison ended before this arm's first call")
    start = clock()
    warmup_calls, converged, call_s = _warm_up(call, clock, sync, options, warmup_deadline)
    warmup_s = clock() - start
    if gate is not None:
        calls = _measure_in_turns(call, clock, sync, gate, warmup_s, converged, call_s)
        return Latency(tuple(calls), summarize_latency(calls), warmup_s, warmup_calls, converged, "pair")
    samples: list[float] = []
    stopped_by, next_check = "calls", options.min_calls
    while len(samples) < options.max_calls:
        samples.append(time_call(call, clock, sync))
        if len(samples) >= next_check:
            next_check = math.ceil(len(samples) * _CI_CHECK_GROWTH)
            if summarize_latency(samples).ci_rel_halfwidth <= options.target_ci_rel:
                stopped_by = "ci"
                break
        if clock() >= deadline:
            stopped_by = "time"
            break
    return Latency(tuple(samples), summarize_latency(samples), warmup_s, warmup_calls, converged, stopped_by)


_DEFAULT_TURN_S = 0.2  # a turn's time when the parent gave none


def _measure_in_turns(call: Callable[[], object], clock: Clock, sync: Callable[[], None], gate: Gate, warmup_s: float,
                      warmup_converged: bool, call_s: float) -> list[float]:
    """After the warm-up (whose calls took `call_s` at the end): one turn of timed calls each time the parent
    says `go`, until it says anything else; every call timed in a turn. Each turn reports its calls, their time
    and its `rate` (1 / the turn's median call)."""
    calls: list[float] = []
    command = gate.pause(GateEvent(READY, warmup_s=warmup_s, warmup_converged=warmup_converged, steps_per_window=1))
    lead_in_share = TimingOptions().turn_lead_in
    while command == GO:
        turn_s = gate.turn_s or _DEFAULT_TURN_S
        # untimed: caches and clocks the other arm left cold; the calls nearest that share of the turn (as the
        # throughput meter's lead-in: none when one call is longer than twice the share)
        lead_in_until = clock() + lead_in_share * turn_s
        while clock() + call_s / 2 < lead_in_until:
            time_call(call, clock, sync)
        turn: list[float] = []
        started = clock()
        while True:  # the calls nearest the turn's time, at least one
            turn.append(time_call(call, clock, sync))
            elapsed_s = clock() - started
            if turn_full(elapsed_s, len(turn), turn_s):
                break
        calls.extend(turn)
        p50_s = call_s = statistics.median(turn)
        command = gate.pause(GateEvent(WINDOW, steps=len(turn), samples=len(turn), elapsed_s=elapsed_s,
                                       rate=1.0 / p50_s if p50_s > 0 else 0.0))
    if not calls:
        raise ValueError("the comparison ended before this arm's first turn")
    return calls
