"""Paired comparisons: two configs measured in alternation, decided on the ratio of each round.

Two runs one after the other compare the host's drift as much as the configs: on a shared machine the
same step gets 10-30% slower between runs, and several times slower while another process holds a
core. `run_pair` measures the two configs (arms A and B) *in alternation* instead:

1. both trial processes start at once (imports, model build, guard steps overlap);
2. each stops at its gate before its first timed step (`torchpace.measure.gate`); then each warms up
   alone, A then B, while the other is stopped (compile and warm-up never overlap a measurement);
3. rounds: the arms take turns A B A B A B ..., each turn one measured window of one arm while the
   other's whole process group (DataLoader workers included) is stopped with SIGSTOP. Every turn lasts
   the same time (`PairOptions.turn_s`, told with each `go`), whichever arm and however fast its steps:
   two arms that warmed up at different speeds (one while two OpenMP threads had lost a core) took
   turns of 0.45 s and 2.0 s beside two busy processes, and a long turn averages the slow spells that
   a short one mostly misses. Every three turns make a round (`paired_ratios`): A B A gives B's turn
   over the mean of the two A turns around it, the next B A B the mean of its two B turns over its A
   turn, and so on, so a drift that is linear over a round cancels and every turn serves exactly one
   round. Rounds centred on B alone (B's k-th turn against the A turns on either side, each A turn
   framing two rounds) lean towards B on a host whose turns are now and then many times slower: a
   slow A turn pushes two rounds above 1, a slow B turn pulls one below, and the median follows.
   Strict alternation, rather than A B B A, keeps every turn alike: each one follows the other arm's
   turn, with caches the other arm left cold and the wake-up a stopped process gets from the
   scheduler, where A B B A would mix those turns with turns that continue the same arm's own;
4. the rounds stop when at least `min_rounds` give a 95% CI of the median ratio within
   ±`target_ci_rel` (`measure.stats.summarize`, the statistics of every other figure), or lie wholly
   on one side of the ratio a decision is taken against (`decide_at`, tune's), or when the rounds'
   time is spent (with `warmups_count`, what the warm-ups took of it is spent too); both arms are
   then told to end and write their results at once, or one at a time while the other waits
   stopped when an arm measures something after its windows (an inference workload's batch-1
   latency), which is then measured alone too.

Other processes' CPU use is read between turns, while both arms are stopped, and is reported per arm
over its own turns. Every arm is ended when the comparison ends for any reason, and a guard process
(`process.StoppedGroupGuard`) SIGKILLs any stopped group should torchpace itself be killed.

A tune's comparisons follow one another with an arm in common: the incumbent kept by one is the
reference of the next; a candidate compared again is the same candidate. With `KeptArms` an arm that
can report (a Workload's training step) is told `report` instead of `end` at the rounds' end: it
writes the result of its windows since its last report and waits, stopped, for the next comparison,
which takes it back without loading or warming it up again (of what it does not take, all but the
most recently used arm is ended before anything starts). Only ending the `KeptArms` ends them; its
guard covers them meanwhile.

Under the latency objective the turns time an inference workload's single batch-1 calls, and each turn's
figure is 1 / its median call (`torchpace.measure.latency`), the objective's score; the throughput is then
what is measured after the turns, alone.

Where two processes cannot be held at once (several ranks per config; a pair that ran out of memory held
together; a peak memory that would not fit twice; a profiled run), the comparison is *sequential*: short
separate runs A B A B A B ..., three to a round as the turns are, and the result says so and why. It runs the rounds a 95% CI needs (`PairOptions.sequential_rounds`),
each run measuring its share of the time: more start-ups than two held processes, but a comparison that can
decide, where two rounds of longer runs could only ever say "too few rounds to tell". Each run warms up as
a whole trial would (`TrialSpec.warmup_s`: a sixth of the time would leave most warm-ups unconverged, and
the comparison unsettled) and has a cap of its own (`PairOptions.run_timeout_s`), within the comparison's.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import select
import signal
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TextIO

import psutil

from torchpace.errors import UsageError
from torchpace.host import HostFacts
from torchpace.knobs.distributed import nproc_of
from torchpace.measure.contention import other_load_cores, probe_cpu_times
from torchpace.measure.gate import END, LOADED, READY, REPORT, REPORTED, WINDOW, go
from torchpace.measure.render import config_label
from torchpace.measure.result import BenchResult, pool_throughput
from torchpace.measure.stats import MIN_WINDOWS_FOR_CI, Summary, summarize
from torchpace.measure.timing import WARMUP_SHARE, window_for
from torchpace.process import StoppedGroupGuard, signal_group, start_child, stop_tree
from torchpace.protocol import INVALID, OOM, TIMEOUT, TrialResult, TrialSpec, classify_timeout
from torchpace.trial.output import follow
from torchpace.trial.runner import (child_stdout, open_trial_output, plan_trial_child, read_trial_result,
                                    remove_orphan_trial_dirs, run_trial, trial_dir, trial_paths)

_log = logging.getLogger(__name__)

ALTERNATING, SEQUENTIAL = "alternating", "sequential"
TURNS_PER_ROUND = 3  # A B A, then B A B, ...: turns, or separate runs, to a round (`paired_ratios`)
PARTNER = "partner"  # an arm ended because the other arm failed: no verdict on its config
_KILL_GRACE_S = 3.0
_POLL_S = 0.05  # how often a wait for an arm looks at whether it is still running
_STOP_WAIT_S = 5.0  # an arm that reported a gate is stopped within this (it stops itself right after)
_HOLD_BOTH_SHARE = 0.8  # two arms are held at once only when twice the peak memory fits in this share
# a turn lasts at most this long: a round of three then mostly falls within one speed of a host whose speed
# switches every few seconds (beside two busy processes, 0.5 s turns gave an A/A comparison 172 rounds in
# 300 s, CI ±3.6%, where 1 s turns gave 89-93 and ±3.6-5.3%)
_MAX_TURN_S = 0.5


@dataclass(frozen=True)
class PairOptions:
    """How long and how precisely to compare.

    Attributes:
        rounds_s: wall seconds for the rounds (both arms' turns together).
        min_rounds: rounds before the CI may stop the comparison (the fewest a 95% CI needs).
        max_rounds: rounds at most (None: the time alone ends them, so a longer comparison narrows the CI).
        target_ci_rel: stop once the 95% CI of the median ratio is within this relative half-width.
        sequential_rounds: rounds of separate runs (A B A, B A B, ...: `separate_runs` runs) when the arms
            cannot take turns; by default the rounds a 95% CI needs, so that a comparison of separate runs
            can decide on its own as one in turns does (two rounds bound the median 1 time in 2).
        run_timeout_s: separate runs: each run's own cap, as a trial of its share of the time would have
            (None: an equal share of the comparison's cap); a run never outlasts the comparison's cap.
        decide_at: the ratio a decision is taken against (tune: accept above 1 + its floor): stop once
            the 95% CI lies wholly above or wholly below it, since more rounds would not change that
            decision (None: only the CI's width stops the rounds early).
        warmups_count: the arms' warm-ups are spent out of `rounds_s`, as a single trial's warm-up is out of
            its time cap (tune's trial time), but the rounds keep at least half of it; False: the rounds get
            all of `rounds_s` (compare's --max-time).
        turn_length_s: how long every turn of either arm lasts (None: the window a bench of `rounds_s` would
            measure, `measure.timing.window_for`, but at most `_MAX_TURN_S`).
    """

    rounds_s: float = 20.0
    min_rounds: int = MIN_WINDOWS_FOR_CI
    max_rounds: int | None = None
    target_ci_rel: float = 0.02
    sequential_rounds: int = MIN_WINDOWS_FOR_CI
    run_timeout_s: float | None = None
    decide_at: float | None = None
    warmups_count: bool = False
    turn_length_s: float | None = None

    @property
    def separate_runs(self) -> int:
        """The runs of a comparison of separate runs: `TURNS_PER_ROUND` to each of its rounds."""
        return TURNS_PER_ROUND * max(1, self.sequential_rounds)

    @property
    def separate_runs_timeout_s(self) -> float | None:
        """The cap of a comparison of separate runs: every run's own cap (None without `run_timeout_s`)."""
        return self.separate_runs * self.run_timeout_s if self.run_timeout_s is not None else None

    def run_time_s(self, rounds_s: float) -> float:
        """What one separate run of a comparison whose arms have `rounds_s` each measures: its round's share."""
        return rounds_s / max(1, self.sequential_rounds)

    @property
    def turn_s(self) -> float:
        """Seconds of every turn, the same for both arms."""
        return self.turn_length_s or min(_MAX_TURN_S, window_for(self.rounds_s))


@dataclass(frozen=True)
class PairResult:
    """Two configs compared round by round; `ratio*` are B over A (above 1: B is faster).

    Attributes:
        mode: `alternating` (turns while the other arm is stopped) or `sequential` (separate runs).
        mode_reason: why the comparison is sequential (None when alternating).
        a, b: each arm's trial result (its bench holds its own measured windows).
        a_rates, b_rates: each turn's figure of each arm (samples/s, or steps/s without samples; under the
            latency objective, calls/s at the turn's median call): A's turns frame B's, so A has one more when
            the comparison ran to its end.
        stopped_by: `ci`, `clear` (the CI wholly on one side of `decide_at`), `time`, `rounds`; `ended`
            (an arm's script finished first) or `failed` (an arm failed, and the other was not judged).
        other_load_a, other_load_b: cores other processes used during each arm's turns (None: unread).
        usable_cores: the cores this host gives torchpace (to judge the other load against).
        reused: the arms (`a`, `b`) whose process came from an earlier comparison (`KeptArms`): their
            start-up, guard steps and warm-up were spent there, and no process was started for them.
    """

    mode: str
    a: TrialResult
    b: TrialResult
    a_rates: tuple[float, ...] = ()
    b_rates: tuple[float, ...] = ()
    stopped_by: str = "failed"
    mode_reason: str | None = None
    other_load_a: float | None = None
    other_load_b: float | None = None
    usable_cores: int | None = None
    wall_time_s: float = 0.0
    reused: tuple[str, ...] = ()

    @property
    def ratios(self) -> list[float]:
        return paired_ratios(self.a_rates, self.b_rates)

    @property
    def summary(self) -> Summary | None:
        """Median ratio B / A with its 95% CI (None without a round)."""
        return summarize(self.ratios) if self.ratios else None

    @property
    def ok(self) -> bool:
        return self.a.ok and self.b.ok and bool(self.ratios)

    def to_dict(self) -> dict[str, Any]:
        """JSON: the arms' results, every round's figures, and the ratio with its CI."""
        data = asdict(self)
        data.update(a=self.a.to_dict(), b=self.b.to_dict(), ratios=self.ratios, **ratio_fields(self.summary))
        return data


def paired_ratios(a_rates: Sequence[float], b_rates: Sequence[float]) -> list[float]:
    """Each round's B / A, from turns taken A B A B ... (A first, `a_rates` and `b_rates` each arm's in order).

    Every three turns are a round: the middle turn against the mean of the two around it, so that a drift
    linear over the round cancels; the middle arm alternates (A B A, then B A B), so each arm is the
    middle of every other round, and each turn serves one round. Rounds are thus independent when turns
    are, and a turn many times slower than the rest moves one round whichever arm it was.
    """
    turns = [rate for pair in zip(a_rates, b_rates) for rate in pair] + list(a_rates[len(b_rates):len(b_rates) + 1])
    ratios = []
    for start in range(0, len(turns) - TURNS_PER_ROUND + 1, TURNS_PER_ROUND):
        before, middle, after = turns[start:start + TURNS_PER_ROUND]
        if min(before, middle, after) > 0:  # a turn that measured nothing leaves its round out
            frame = (before + after) / 2
            ratios.append(middle / frame if start % 2 == 0 else frame / middle)  # A first at even turns
    return ratios


def ratio_fields(summary: Summary | None) -> dict[str, Any]:
    """The ratio figures of a comparison, named as every output shows them (None without a round)."""
    if summary is None:
        return {"ratio": None, "ratio_ci_low": None, "ratio_ci_high": None, "ratio_ci_coverage": None, "rounds": 0}
    return {"ratio": summary.median, "ratio_ci_low": summary.ci_low, "ratio_ci_high": summary.ci_high,
            "ratio_ci_coverage": summary.ci_coverage, "rounds": summary.n}


def rounds_time(options: PairOptions, warmups_s: float) -> float:
    """Seconds the rounds may take after warm-ups that took `warmups_s` (see `PairOptions.warmups_count`)."""
    if not options.warmups_count:
        return options.rounds_s
    return max(options.rounds_s / 2, options.rounds_s - warmups_s)


def sequential_reason(spec_a: TrialSpec, spec_b: TrialSpec, *, peak_bytes: int | None = None,
                      available_bytes: int | None = None, new_processes: int = 2) -> str | None:
    """Why the two arms cannot take turns as two processes held at once (None: they can).

    Args:
        peak_bytes: a peak memory one arm is expected to reach (e.g. the baseline's), device or host.
        available_bytes: the memory free for the arms to start on that device (or host).
        new_processes: the arms to start (an arm kept from an earlier comparison holds its memory already).
    """
    ranks = max(nproc_of(spec_a.config), nproc_of(spec_b.config))
    if ranks > 1:
        return f"a config runs {ranks} processes (torchrun), which cannot be stopped and continued as one"
    if spec_a.script_mode != "bench" or spec_b.script_mode != "bench" or spec_a.profile or spec_b.profile:
        return "a profiled run is not measured in turns"
    if not fits_beside(peak_bytes, available_bytes, new_processes):
        runs = "two runs" if new_processes == 2 else "another run beside the one kept"
        return f"{runs} of {peak_bytes / 2**30:.1f} GiB peak memory would not fit in the {available_bytes / 2**30:.1f} GiB free"
    return None


def fits_beside(peak_bytes: int | None, available_bytes: int | None, processes: int) -> bool:
    """Whether `processes` more processes of `peak_bytes` each fit in the memory free (unknown: they do)."""
    return not (peak_bytes and available_bytes is not None and processes * peak_bytes > _HOLD_BOTH_SHARE * available_bytes)


def hold_both_reason(spec_a: TrialSpec, spec_b: TrialSpec, kept_arms: KeptArms | None, peak_bytes: int | None,
                     available_bytes: Callable[[], int | None]) -> str | None:
    """Why the two arms of a comparison that takes its arms from `kept_arms` cannot be held at once
    (`sequential_reason`; None: they can), judged by `peak_bytes` times the arms to start against the memory
    free (`available_bytes()`, read again after ending arms). When memory alone is short, the kept arms this
    comparison does not need are ended first. When the comparison must be separate runs anyway (several
    ranks), the kept arms stay stopped through them, for the comparisons after them, while the runs' ranks
    fit beside them (else every kept arm is ended)."""
    specs = (spec_a, spec_b)
    new = 2 - kept_arms.reusable(specs) if kept_arms is not None else 2

    def reason() -> str | None:
        return sequential_reason(spec_a, spec_b, peak_bytes=peak_bytes, available_bytes=available_bytes(),
                                 new_processes=new)

    first = reason()
    if first is None or kept_arms is None:
        return first
    if sequential_reason(spec_a, spec_b) is None:  # memory alone: the kept arms it does not need may hold it
        return reason() if kept_arms.keep_only(specs) else first
    ranks = max(nproc_of(spec_a.config), nproc_of(spec_b.config))
    if not fits_beside(peak_bytes, available_bytes(), ranks):
        kept_arms.keep_only(())
    return first


def run_pair(spec_a: TrialSpec, spec_b: TrialSpec, host: HostFacts, timeout_s: float, options: PairOptions = PairOptions(),
             *, base_env: Mapping[str, str] | None = None, workdir: Path | None = None, sequential: str | None = None,
             figure: Callable[[BenchResult], float | None] | None = None,
             on_round: Callable[[int, Summary | None], None] | None = None,
             logs: tuple[Path | None, Path | None] = (None, None), echo: TextIO | None = None,
             kept_arms: KeptArms | None = None, fallback_timeout_s: Callable[[], float] | None = None) -> PairResult:
    """Compare `spec_b` with `spec_a` (see the module docstring); never raises for the arms' failures.

    Args:
        timeout_s: the whole comparison's cap (start-up, guard steps, warm-ups, rounds, ending).
        sequential: compare with separate runs, for this reason (default: `sequential_reason`).
        figure: a sequential round's figure of one run's bench (default: samples/s, else steps/s).
        on_round: progress: rounds so far and the ratio's summary.
        logs: script mode: where each arm's script output is kept (`torchpace.trial.output`; None: a
            temporary file).
        echo: script mode: also copy arm B's output here as it comes (`--show-output`).
        kept_arms: take the arms from, and keep them for, the comparisons before and after this one (see
            `KeptArms`; an alternating comparison's only: separate runs end with each run). Separate runs leave
            the arms it holds as they are, stopped, for the comparisons after them (the caller ends them when
            memory would not hold both); a pair that ran out of memory held together ends them.
        fallback_timeout_s: the cap of the separate runs that follow when the arms ran out of memory held
            together, asked when they start (default: `options.separate_runs_timeout_s`, else `timeout_s`): the
            cap of a comparison in turns holds 2 start-ups, not 18.
    """
    base_env = os.environ if base_env is None else base_env
    reason = sequential or sequential_reason(spec_a, spec_b)
    output = _Output(logs, echo)
    if reason:  # the arms kept stay stopped: no CPU of the host's, and the caller judged their memory
        return _run_sequential(spec_a, spec_b, host, timeout_s, options, reason, base_env, workdir, figure, on_round, output)
    result = _run_alternating(spec_a, spec_b, host, timeout_s, options, base_env, workdir, on_round, output, kept_arms)
    if OOM in (result.a.status, result.b.status):  # held together they did not fit: separate runs
        if kept_arms is not None:
            kept_arms.release()
        cap_s = fallback_timeout_s() if fallback_timeout_s else options.separate_runs_timeout_s or timeout_s
        return _run_sequential(spec_a, spec_b, host, cap_s, options, "an arm ran out of memory while both were held",
                               base_env, workdir, figure, on_round, output)
    return result


@dataclass(frozen=True)
class _Output:
    """Where the arms' script output goes: a log per arm, and arm B's also streamed to `echo`."""

    logs: tuple[Path | None, Path | None] = (None, None)
    echo: TextIO | None = None

    def log(self, name: str) -> Path | None:
        return self.logs["ab".index(name)]

    def echo_of(self, name: str) -> TextIO | None:
        return self.echo if name == "b" else None


# --------------------------------------------------------------------------- alternating


class _Arm:
    """The parent's handle on one arm: its process, its two pipes, its folder and files. An arm lives as long
    as its process: for one comparison, or for several when an `KeptArms` keeps it between them."""

    def __init__(self, name: str, spec: TrialSpec, workdir: Path | None, log_path: Path | None = None):
        self.name = name
        self._folder = contextlib.ExitStack()
        self.folder = self._folder.enter_context(trial_dir(workdir))
        self.spec_path, self.result_path, self.err_path = trial_paths(self.folder, spec, log_path)
        self.control_r, self.control_w = os.pipe()
        self.event_r, self.event_w = os.pipe()
        self.spec = replace(spec, gate=f"{self.control_r},{self.event_w}", compute_only=False)
        self.proc = None
        self._buffer = b""
        self.events: list[dict] = []
        self.load_cpu_s = self.load_wall_s = 0.0
        self.ready = False  # warmed up: the rounds may start (a kept arm comes to its next comparison ready)
        self.kept = False  # handed to an `KeptArms`: the comparison that ends leaves it be

    def start(self, host: HostFacts, base_env: Mapping[str, str], timeout_s: float, guard: StoppedGroupGuard) -> None:
        self.spec.save(self.spec_path)
        argv, env, nofile = plan_trial_child(self.spec, host, base_env, self.spec_path, self.result_path, timeout_s)
        with open_trial_output(self.err_path) as err:
            self.proc = start_child(argv, death_signal=signal.SIGKILL, nofile=nofile, env=env,
                                    stdout=child_stdout(self.spec, err), stderr=err, pass_fds=(self.control_r, self.event_w))
        guard.hold(self.proc.pid)
        self._close_child_ends()  # the child holds them now: its end of the event pipe closes when it dies

    def _close_child_ends(self) -> None:
        for fd in (self.control_r, self.event_w):
            if fd is not None:
                os.close(fd)
        self.control_r = self.event_w = None

    def next_event(self, deadline: float) -> dict | None:
        """The next gate this arm reports, None when it ended first or `deadline` (monotonic) passed."""
        while b"\n" not in self._buffer:
            if self.proc.poll() is not None or time.monotonic() >= deadline:
                return None
            ready, _, _ = select.select([self.event_r], [], [], _POLL_S)
            if ready:
                chunk = os.read(self.event_r, 4096)
                if not chunk:  # every writer closed: the arm's processes are gone
                    self.proc.wait()
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        event = json.loads(line)
        self.events.append(event)
        return event

    def await_gate(self, kind: str, deadline: float) -> dict | None:
        """Wait until this arm reports gate `kind` and is stopped; its event (None: it ended or time ran out)."""
        event = self.next_event(deadline)
        if event is None or event.get("event") != kind:
            return None
        return event if _wait_stopped(self.proc, min(deadline, time.monotonic() + _STOP_WAIT_S)) else None

    def resume(self, command: str) -> None:
        os.write(self.control_w, f"{command}\n".encode())
        signal_group(self.proc.pid, signal.SIGCONT)

    @property
    def keepable(self) -> bool:
        """Stopped at a gate, and able to report its windows and go on with another comparison."""
        last = self.events[-1] if self.events else {}
        return (self.proc is not None and self.proc.poll() is None and bool(last.get("keepable"))
                and last.get("event") in (READY, WINDOW, REPORTED))

    @property
    def measured(self) -> bool:
        """It stopped after a measured window (not at a gate before any, or at its last report)."""
        return bool(self.events) and self.events[-1].get("event") == WINDOW

    def report(self, deadline: float) -> TrialResult | None:
        """Ask a `keepable` arm that `measured` for the result of its windows since its last report; it then
        waits, stopped, for its next comparison. None: it did not stop at its report (it ended, or the
        deadline passed)."""
        self.resume(REPORT)
        if self.await_gate(REPORTED, deadline) is None or not self.result_path.exists():
            return None
        result = read_trial_result(self.spec, self.result_path, self.err_path, 0, 0.0)
        self.result_path.unlink()  # a later ending without a result must not read this one
        return result

    def join(self, name: str) -> _Arm:
        """Take part in a new comparison as arm `name`: its events and other load are that comparison's."""
        self.name, self.events, self.kept = name, [], False
        self.load_cpu_s = self.load_wall_s = 0.0
        return self

    def dispose(self, guard: StoppedGroupGuard) -> None:
        """End what is left of the arm's tree (a stopped group is continued so it can act on SIGTERM), close
        its pipes and remove its folder; nothing when an `KeptArms` holds it now."""
        if self.kept:
            return
        if self.proc is not None:
            signal_group(self.proc.pid, signal.SIGTERM)
            signal_group(self.proc.pid, signal.SIGCONT)
            stop_tree(self.proc, _KILL_GRACE_S)
            guard.release(self.proc.pid)
            self.proc = None
        self._close_child_ends()
        for fd in (self.control_w, self.event_r):
            if fd is not None:
                os.close(fd)
        self.control_w = self.event_r = None
        self._folder.close()

    @property
    def other_load(self) -> float | None:
        return self.load_cpu_s / self.load_wall_s if self.load_wall_s > 0 else None


class KeptArms:
    """Keeps the arms of a comparison, stopped, for the next one (a tune's comparisons: the incumbent of one
    is the reference of the next; a candidate compared again is the same candidate).

    An arm is taken back when the next comparison asks for the same process: the same trial spec but for
    its time cap and its gate, and the guard steps it ran when the new role needs them (a reference needs
    none). Its start-up, guard steps and warm-up are then not spent again, and no process is started for
    it. At most `capacity` processes are held, the comparison's own two included: before anything starts,
    the arms it does not take are ended, the least recently used first, down to `capacity - 2` (the
    default 3 keeps the candidate before the last one, which greedy compares again once a knob's values
    are all in), besides one arm for each spec `hold` names (a tune's defaults, which its final
    comparison measures again): that one is ended only when memory is short (`keep_only`) or at the
    end. Use it as a context manager around the comparisons
    (`run_pair(..., kept_arms=)`): on the way out, however it is left, every kept arm is ended, and its
    `process.StoppedGroupGuard` SIGKILLs them should torchpace itself be killed meanwhile.

    Only arms that can report (a workload's training step, measured in turns: `Gate.reporter`) are kept: a
    script runs to its own end, and an inference workload measures a figure once, alone, after its turns
    (batch-1 latency, or under the latency objective its throughput).
    """

    def __init__(self, capacity: int = 3):
        self.capacity = max(2, capacity)
        self._arms: list[_Arm] = []  # the least recently used first
        self._held: list[TrialSpec] = []  # specs an arm is kept for beyond the capacity
        self._stack = contextlib.ExitStack()
        self.guard: StoppedGroupGuard | None = None

    def __enter__(self) -> KeptArms:
        self.guard = self._stack.enter_context(StoppedGroupGuard())
        self._stack.callback(self.release)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def pids(self) -> list[int]:
        """The processes held, stopped, for the next comparison."""
        return [arm.proc.pid for arm in self._arms]

    def take(self, specs: Sequence[TrialSpec]) -> list[_Arm | None]:
        """The kept arm of each spec (None: a process must be started for it); of the arms not taken, the
        least recently used are ended down to `capacity - 2`."""
        taken = self._match(specs)
        for arm in taken:
            if arm is not None:
                self._arms.remove(arm)
        held = {id(arm) for arm in self._match(self._held) if arm is not None}
        spare = [arm for arm in self._arms if id(arm) not in held]
        self._release(spare[:max(0, len(spare) - (self.capacity - 2))])
        return taken

    def hold(self, spec: TrialSpec) -> None:
        """Keep an arm that serves `spec` beyond the capacity, for a comparison that comes later (a tune's
        final one measures the defaults of its first one again): `keep_only` and the end still end it."""
        if not any(_same_process(held, spec) for held in self._held):
            self._held.append(spec)

    def end_serving(self, spec: TrialSpec) -> int:
        """End every arm held that runs `spec`'s config (whatever guard steps it ran), so that a comparison
        measures it in a fresh process (a tune's final one: the process a decision kept was more likely a fast
        one); the arms ended."""
        serving = [arm for arm in self._arms if _same_process(arm.spec, replace(spec, guard_steps=0))]
        self._release(serving)
        return len(serving)

    def reusable(self, specs: Sequence[TrialSpec]) -> int:
        """How many of `specs` a kept arm would serve (see `take`)."""
        return sum(arm is not None for arm in self._match(specs))

    def keep_only(self, specs: Sequence[TrialSpec]) -> int:
        """End every arm held that would not serve one of `specs` (their memory is needed); the arms ended."""
        serving = {id(arm) for arm in self._match(specs) if arm is not None}
        spare = [arm for arm in self._arms if id(arm) not in serving]
        self._release(spare)
        return len(spare)

    def _match(self, specs: Sequence[TrialSpec]) -> list[_Arm | None]:
        taken: list[_Arm | None] = [None] * len(specs)
        for i in sorted(range(len(specs)), key=lambda i: -specs[i].guard_steps):  # the roles that need guard steps first
            taken[i] = next((arm for arm in reversed(self._arms)  # the most recently used first
                             if arm not in taken and _same_process(arm.spec, specs[i])), None)
        return taken

    def keep(self, arm: _Arm) -> None:
        arm.kept = True
        self._arms.append(arm)

    def release(self) -> None:
        """End every arm held."""
        self._release(list(self._arms))

    def _release(self, arms: Sequence[_Arm]) -> None:
        for arm in arms:
            self._arms.remove(arm)
            arm.kept = False
            arm.dispose(self.guard)


def _same_process(kept: TrialSpec, wanted: TrialSpec) -> bool:
    """A kept arm's process serves `wanted`: the same spec but for the time cap and gate, with the guard
    steps the role needs (none, or the ones it ran)."""
    ignored = {"gate": None, "max_time_s": 0.0, "guard_steps": 0, "compute_only": False}
    return replace(kept, **ignored) == replace(wanted, **ignored) and wanted.guard_steps in (0, kept.guard_steps)


def _wait_stopped(proc, deadline: float) -> bool:
    """True once `proc` is stopped (state T); False when it ended or `deadline` passed."""
    try:
        process = psutil.Process(proc.pid)
        while time.monotonic() < deadline:
            if process.status() == psutil.STATUS_STOPPED:
                return True
            if proc.poll() is not None:
                return False
            time.sleep(0.001)
    except psutil.Error:
        return False
    return False


class _LoadMeter:
    """Other processes' CPU seconds between turns, read while both arms are stopped."""

    def __init__(self):
        self._probe = probe_cpu_times
        self._last = probe_cpu_times()

    def charge(self, arm: _Arm) -> None:
        """The load since the last reading counts for `arm`, whose turn it was."""
        now = self._probe()
        cores = other_load_cores(self._last, now)
        if cores is not None:
            wall_s = now.at_s - self._last.at_s
            arm.load_cpu_s += cores * wall_s
            arm.load_wall_s += wall_s
        self._last = now


def _run_alternating(spec_a: TrialSpec, spec_b: TrialSpec, host: HostFacts, timeout_s: float, options: PairOptions,
                     base_env: Mapping[str, str], workdir: Path | None, on_round, output: _Output,
                     kept_arms: KeptArms | None = None) -> PairResult:
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    remove_orphan_trial_dirs(workdir)
    with contextlib.ExitStack() as stack:
        guard = kept_arms.guard if kept_arms is not None else stack.enter_context(StoppedGroupGuard())
        kept = kept_arms.take([spec_a, spec_b]) if kept_arms is not None else [None, None]
        arms = []
        for name, spec, arm in zip("ab", (spec_a, spec_b), kept):
            arms.append(arm.join(name) if arm is not None else _Arm(name, spec, workdir, output.log(name)))
            stack.callback(arms[-1].dispose, guard)  # on any way out: nothing of an arm is left that is not kept
        if spec_b.command:
            stack.enter_context(follow(arms[1].err_path, output.echo_of("b")))
        for arm in arms:
            if arm.proc is not None:  # kept from an earlier comparison
                continue
            try:
                arm.start(host, base_env, timeout_s, guard)
            except UsageError as err:  # e.g. numactl or an allocator this arm's config needs is not installed
                invalid = TrialResult(INVALID, error=str(err))
                partner = TrialResult(PARTNER, error=f"the other arm's config cannot run here; {_label(arms[arm is arms[0]])} "
                                      "was not judged")
                a, b = (invalid, partner) if arm is arms[0] else (partner, invalid)
                return PairResult(ALTERNATING, a, b, wall_time_s=time.perf_counter() - started)
        reused = tuple(arm.name for arm, was_kept in zip(arms, kept) if was_kept is not None)
        rounds = _Rounds(arms, options, on_round)
        ended = rounds.run(deadline)
        stopped_by, results = _arm_results(arms, ended, deadline, timeout_s, kept_arms)
        return PairResult(ALTERNATING, results[0], results[1], tuple(rounds.rates["a"]), tuple(rounds.rates["b"]),
                          stopped_by or rounds.stopped_by, other_load_a=arms[0].other_load,
                          other_load_b=arms[1].other_load, usable_cores=host.usable_cores,
                          wall_time_s=time.perf_counter() - started, reused=reused)


class _Rounds:
    """Loading, the two warm-ups and the rounds of an alternating comparison."""

    def __init__(self, arms: list[_Arm], options: PairOptions, on_round):
        self.arms, self.options, self.on_round = arms, options, on_round
        self.rates: dict[str, list[float]] = {"a": [], "b": []}
        self.stopped_by = ""

    def run(self, deadline: float) -> _Arm | None:
        """Run to the end; the arm that failed (ended, or missed `deadline`) or None."""
        started = time.monotonic()
        new = [arm for arm in self.arms if not arm.ready]  # a kept arm loaded and warmed up in an earlier comparison
        for arm in new:  # both load at once; each stops before its first timed step
            if arm.await_gate(LOADED, deadline) is None:
                return arm
        _log.info("%s loaded after %.1f s", "both arms" if len(new) == 2 else f"{len(new)} new arm(s)",
                  time.monotonic() - started)
        warmups_started = time.monotonic()
        for arm in new:  # each warms up alone
            arm.resume(go(self.options.turn_s))
            ready = arm.await_gate(READY, deadline)
            if ready is None:
                return arm
            arm.ready = True
            _log.info("arm %s warmed up in %.1f s of its own (%s), %d steps per window", arm.name.upper(),
                      ready["warmup_s"], "converged" if ready["warmup_converged"] else "not converged",
                      ready["steps_per_window"])
        warmups_s = time.monotonic() - warmups_started
        _log.info("rounds start %.1f s after the arms did", time.monotonic() - started)
        load = _LoadMeter()
        rounds_end = time.monotonic() + rounds_time(self.options, warmups_s)
        for turn in itertools.count():  # A B A B ...: every third turn completes a round (`paired_ratios`)
            arm = self.arms[turn % 2]
            arm.resume(go(self.options.turn_s))
            event = arm.await_gate(WINDOW, deadline)
            if event is None:
                return arm
            load.charge(arm)
            self.rates[arm.name].append(_turn_rate(event))
            _log.debug("turn %d, arm %s: %d steps in %.3f s, %.0f a second", turn, arm.name.upper(), event["steps"],
                       event["elapsed_s"], self.rates[arm.name][-1])
            if (turn + 1) % TURNS_PER_ROUND == 0 and self._done(rounds_end):
                return None

    def _done(self, rounds_end: float) -> bool:
        ratios = paired_ratios(self.rates["a"], self.rates["b"])
        summary = summarize(ratios) if ratios else None
        if self.on_round:
            self.on_round(len(ratios), summary)
        enough = len(ratios) >= self.options.min_rounds and summary is not None
        if enough and summary.ci_rel_halfwidth <= self.options.target_ci_rel:
            self.stopped_by = "ci"
        elif enough and self.options.decide_at is not None and not summary.ci_low <= self.options.decide_at <= summary.ci_high:
            self.stopped_by = "clear"
        elif self.options.max_rounds is not None and len(ratios) >= self.options.max_rounds:
            self.stopped_by = "rounds"
        elif time.monotonic() >= rounds_end:
            self.stopped_by = "time"
        if self.stopped_by and summary is not None:
            _log.info("rounds stopped by %s after %d: B/A %.3f [%.3f, %.3f]", self.stopped_by, summary.n, summary.median,
                      summary.ci_low, summary.ci_high)
        return bool(self.stopped_by)


def _turn_rate(event: Mapping[str, Any]) -> float:
    """A turn's figure: the `rate` an arm reports (1 / the median batch-1 call of a latency turn), else its
    samples (or steps) over its time; 0 when it measured nothing."""
    if "rate" in event:
        return float(event["rate"])
    return event["samples"] / event["elapsed_s"] if event["elapsed_s"] > 0 else 0.0


def _arm_results(arms: list[_Arm], ended: _Arm | None, deadline: float, timeout_s: float,
                 kept_arms: KeptArms | None = None) -> tuple[str, list[TrialResult]]:
    """(why the comparison stopped, when not by its own rule; each arm's result).

    The rounds over, the arms are told to end, and each result is read once its arm has: both at once,
    or one at a time when an arm measures something more after its windows (an inference workload's
    batch-1 latency: `Gate.alone_after`), which is then measured alone too. With `kept_arms`, an arm
    that can be kept reports instead of ending, and is kept unless its report failed (a loss gone NaN).
    An arm that ended by itself (`ended`) with a result, a script that finished first, ends the
    comparison there; one that failed, or reached no gate by the deadline, is that config's failure,
    and the other arm is not judged (but kept, when it can be: what it measured in this comparison is
    left out of its next report).
    """
    first = _ended_result(ended, timeout_s, deadline) if ended is not None else None
    if first is not None and not first.ok:
        for arm in arms:
            if arm is ended or kept_arms is None or not arm.keepable:
                continue
            if arm.measured:
                _report_and_keep(arm, kept_arms, deadline)
            else:  # no turn of it to leave out of its next report
                kept_arms.keep(arm)
        return "failed", [first if arm is ended else TrialResult(
            PARTNER, error=f"the comparison ended when the other arm failed; {_label(arm)} was not judged") for arm in arms]
    live = [arm for arm in arms if arm is not ended]
    results: dict[str, TrialResult] = {}
    for arm in live:
        report = _report_and_keep(arm, kept_arms, deadline)
        if report is not None:
            results[arm.name] = report
    ending = [arm for arm in live if arm.name not in results and arm.proc.poll() is None]
    together = not any(event.get("alone_after") for arm in ending for event in arm.events)
    _log.info("%d arm(s) reported for the next comparison; the others end %s", len(results),
              "at once" if together else "one at a time (an arm measures after its windows)")
    if together:
        for arm in ending:
            arm.resume(END)
    for arm in live:
        if arm.name in results:
            continue
        if not together and arm in ending:
            arm.resume(END)
        try:
            returncode = arm.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            results[arm.name] = TrialResult(TIMEOUT, error=f"{_label(arm)} did not end within the comparison's {timeout_s:.0f} s")
            continue
        results[arm.name] = read_trial_result(arm.spec, arm.result_path, arm.err_path, returncode, 0.0)
    if ended is not None:
        results[ended.name] = first
    return ("ended" if ended is not None else ""), [results[arm.name] for arm in arms]


def _report_and_keep(arm: _Arm, kept_arms: KeptArms | None, deadline: float) -> TrialResult | None:
    """The report of an arm that can be kept and `measured`, which is then kept for the next comparison
    unless its report failed (a process whose loss went NaN is not measured again); None, and the arm not
    kept, where it gives no report (it is to end)."""
    if kept_arms is None or not arm.keepable or not arm.measured:
        return None
    report = arm.report(deadline)
    if report is not None and report.ok:
        kept_arms.keep(arm)
    return report


def _ended_result(arm: _Arm, timeout_s: float, deadline: float) -> TrialResult:
    """The result of an arm that stopped taking turns: its own ending, or a timeout when it still runs at
    `deadline` (monotonic). An arm can stop taking turns before the deadline and still run for a while: one
    that reported a gate and then failed instead of stopping there (a DataLoader worker killed: the loader
    raises, then waits up to 5 s for its other workers) is waited for, and its failure is what it is; one
    that is stopped does not end by itself and is not waited for."""
    returncode = arm.proc.poll()
    if returncode is None and not _wait_stopped(arm.proc, deadline):  # it ended meanwhile, or the deadline passed
        returncode = arm.proc.poll()
    if returncode is None:  # still running at the deadline (or stopped): it reached no gate in time
        status, why = classify_timeout(_tail(arm.err_path), [])
        return TrialResult(status, error=f"{_label(arm)} reached no gate within the comparison's {timeout_s:.0f} s"
                           + (f": {why}" if why else ""), stderr_tail=_tail(arm.err_path))
    return read_trial_result(arm.spec, arm.result_path, arm.err_path, returncode, 0.0)


def _label(arm: _Arm) -> str:
    return f"arm {arm.name.upper()} ({config_label(arm.spec.config, bool(arm.spec.command))})"


def _tail(path: Path, size: int = 4000) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-size:].decode(errors="replace")


# --------------------------------------------------------------------------- sequential


def _run_sequential(spec_a: TrialSpec, spec_b: TrialSpec, host: HostFacts, timeout_s: float, options: PairOptions,
                    reason: str, base_env, workdir, figure, on_round, output: _Output = _Output()) -> PairResult:
    """Separate runs A B A B ..., three to each of `options.sequential_rounds` rounds, each run measuring its
    share of its arm's time cap and capped by `options.run_timeout_s` (within the comparison's `timeout_s`);
    the rounds' ratios are `paired_ratios`' of their figures."""
    started = time.perf_counter()
    figure = figure or _throughput
    runs: dict[str, list[TrialResult]] = {"a": [], "b": []}
    rates: dict[str, list[float]] = {"a": [], "b": []}
    specs = {"a": separate_run_spec(spec_a, options), "b": separate_run_spec(spec_b, options)}
    order = ["ab"[turn % 2] for turn in range(options.separate_runs)]  # A B A B ...
    run_cap_s = options.run_timeout_s or timeout_s / len(order)
    _log.info("comparing in %d separate runs, %.0f s at most: %s", len(order), timeout_s, reason)
    for name in order:
        left_s = timeout_s - (time.perf_counter() - started)
        result = run_trial(specs[name], host, timeout_s=max(1.0, min(run_cap_s, left_s)), base_env=base_env,
                           workdir=workdir, log_path=output.log(name), echo=output.echo_of(name))
        value = figure(result.bench) if result.ok and result.bench else None
        if value is None:  # this config's failure; the other is not judged
            partner = TrialResult(PARTNER, error="the comparison ended when the other arm failed; this config was not judged")
            a, b = (result, partner) if name == "a" else (partner, result)
            return PairResult(SEQUENTIAL, a, b, tuple(rates["a"]), tuple(rates["b"]), "failed", reason,
                              usable_cores=host.usable_cores, wall_time_s=time.perf_counter() - started)
        runs[name].append(result)
        rates[name].append(value)
        if on_round and (len(rates["a"]) + len(rates["b"])) % TURNS_PER_ROUND == 0:  # a round completed
            ratios = paired_ratios(rates["a"], rates["b"])
            on_round(len(ratios), summarize(ratios))
    return PairResult(SEQUENTIAL, _pooled(runs["a"]), _pooled(runs["b"]), tuple(rates["a"]), tuple(rates["b"]), "rounds",
                      reason, other_load_a=_median_load(runs["a"]), other_load_b=_median_load(runs["b"]),
                      usable_cores=host.usable_cores, wall_time_s=time.perf_counter() - started)


def separate_run_spec(spec: TrialSpec, options: PairOptions) -> TrialSpec:
    """One separate run of `spec`'s arm: it measures its round's share of the arm's time, after a warm-up that
    may take as long as a whole trial's (a sixth of the time would leave most warm-ups unconverged)."""
    return replace(spec, max_time_s=options.run_time_s(spec.max_time_s), warmup_s=WARMUP_SHARE * spec.max_time_s)


def _pooled(runs: Sequence[TrialResult]) -> TrialResult:
    """One arm's separate runs as one result: the first run's, its windows those of every run."""
    first = runs[0]
    throughput = pool_throughput([r.bench.throughput for r in runs])
    return replace(first, bench=replace(first.bench, throughput=throughput))


def _throughput(bench: BenchResult | None) -> float | None:
    return bench.objective.value if bench is not None else None


def _median_load(runs: Sequence[TrialResult]) -> float | None:
    loads = [r.bench.other_load_cores for r in runs if r.bench and r.bench.other_load_cores is not None]
    return statistics.median(loads) if loads else None
