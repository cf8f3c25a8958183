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

This module runs a comparison: `run_pair` chooses turns or separate runs, and drives them. What is pure in
it (the options, the rounds, their stop rule, when the arms must be separate runs) is
`torchpace.trial.schedule`; the arms' processes, their gates and the arms kept between comparisons are
`torchpace.trial.arms`.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
import itertools
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Mapping, TextIO

from torchpace.errors import UsageError
from torchpace.host import HostFacts
from torchpace.measure.gate import END, LOADED, READY, WINDOW, go
from torchpace.measure.result import BenchResult
from torchpace.measure.stats import Summary, summarize
from torchpace.process import StoppedGroupGuard
from torchpace.protocol import INVALID, OOM, TIMEOUT, TrialResult, TrialSpec, classify_timeout
from torchpace.trial.arms import Arm, ArmOutput, KeptArms, LoadMeter, arm_label, stderr_tail, wait_stopped
from torchpace.trial.output import follow
from torchpace.trial.runner import read_trial_result, remove_orphan_trial_dirs, run_trial
from torchpace.trial.schedule import (ALTERNATING, PARTNER, SEQUENTIAL, TURNS_PER_ROUND, PairOptions, PairResult, median_load,
                                      objective_figure, paired_ratios, pooled_runs, rounds_stop, rounds_time,
                                      separate_run_spec, sequential_reason)

_log = logging.getLogger(__name__)


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
    output = ArmOutput(logs, echo)
    if reason:  # the arms kept stay stopped: no CPU of the host's, and the caller judged their memory
        return _run_sequential(spec_a, spec_b, host, timeout_s, options, reason, base_env, workdir, figure, on_round, output)
    result = _run_alternating(spec_a, spec_b, host, timeout_s, options, base_env, workdir, on_round, output, kept_arms)
    separate = result.a.separate_runs or result.b.separate_runs
    if separate:  # a job of several ranks, found when it ran: it is measured as one job in separate runs
        if kept_arms is not None:
            kept_arms.release()
        cap_s = fallback_timeout_s() if fallback_timeout_s else options.separate_runs_timeout_s or timeout_s
        ranks = result.a.ranks or result.b.ranks
        spec_a, spec_b = (replace(spec, script_ranks=ranks) for spec in (spec_a, spec_b))
        return _run_sequential(spec_a, spec_b, host, cap_s, options, separate, base_env, workdir, figure, on_round, output)
    if OOM in (result.a.status, result.b.status):  # held together they did not fit: separate runs
        if kept_arms is not None:
            kept_arms.release()
        cap_s = fallback_timeout_s() if fallback_timeout_s else options.separate_runs_timeout_s or timeout_s
        return _run_sequential(spec_a, spec_b, host, cap_s, options, "an arm ran out of memory while both were held",
                               base_env, workdir, figure, on_round, output)
    return result


# --------------------------------------------------------------------------- alternating


def _run_alternating(spec_a: TrialSpec, spec_b: TrialSpec, host: HostFacts, timeout_s: float, options: PairOptions,
                     base_env: Mapping[str, str], workdir: Path | None, on_round, output: ArmOutput,
                     kept_arms: KeptArms | None = None) -> PairResult:
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    remove_orphan_trial_dirs(workdir)
    with contextlib.ExitStack() as stack:
        guard = kept_arms.guard if kept_arms is not None else stack.enter_context(StoppedGroupGuard())
        kept = kept_arms.take([spec_a, spec_b]) if kept_arms is not None else [None, None]
        arms = []
        for name, spec, arm in zip("ab", (spec_a, spec_b), kept):
            arms.append(arm.join(name) if arm is not None else Arm(name, spec, workdir, output.log(name)))
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
                partner = TrialResult(PARTNER, error=f"the other arm's config cannot run here; {arm_label(arms[arm is arms[0]])} "
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

    def __init__(self, arms: list[Arm], options: PairOptions, on_round):
        self.arms, self.options, self.on_round = arms, options, on_round
        self.rates: dict[str, list[float]] = {"a": [], "b": []}
        self.stopped_by = ""

    def run(self, deadline: float) -> Arm | None:
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
                      ready.warmup_s, "converged" if ready.warmup_converged else "not converged", ready.steps_per_window)
        warmups_s = time.monotonic() - warmups_started
        _log.info("rounds start %.1f s after the arms did", time.monotonic() - started)
        load = LoadMeter()
        rounds_end = time.monotonic() + rounds_time(self.options, warmups_s)
        for turn in itertools.count():  # A B A B ...: every third turn completes a round (`paired_ratios`)
            arm = self.arms[turn % 2]
            arm.resume(go(self.options.turn_s))
            event = arm.await_gate(WINDOW, deadline)
            if event is None:
                return arm
            load.charge(arm)
            self.rates[arm.name].append(event.turn_rate)
            _log.debug("turn %d, arm %s: %d steps in %.3f s, %.0f a second", turn, arm.name.upper(), event.steps,
                       event.elapsed_s, self.rates[arm.name][-1])
            if (turn + 1) % TURNS_PER_ROUND == 0 and self._done(rounds_end):
                return None

    def _done(self, rounds_end: float) -> bool:
        ratios = paired_ratios(self.rates["a"], self.rates["b"])
        summary = summarize(ratios) if ratios else None
        if self.on_round:
            self.on_round(len(ratios), summary)
        self.stopped_by = rounds_stop(ratios, self.options, time.monotonic(), rounds_end)
        if self.stopped_by and summary is not None:
            _log.info("rounds stopped by %s after %d: B/A %.3f [%.3f, %.3f]", self.stopped_by, summary.n, summary.median,
                      summary.ci_low, summary.ci_high)
        return bool(self.stopped_by)



def _arm_results(arms: list[Arm], ended: Arm | None, deadline: float, timeout_s: float,
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
            PARTNER, error=f"the comparison ended when the other arm failed; {arm_label(arm)} was not judged") for arm in arms]
    live = [arm for arm in arms if arm is not ended]
    results: dict[str, TrialResult] = {}
    for arm in live:
        report = _report_and_keep(arm, kept_arms, deadline)
        if report is not None:
            results[arm.name] = report
    ending = [arm for arm in live if arm.name not in results and arm.proc.poll() is None]
    together = not any(event.alone_after for arm in ending for event in arm.events)
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
            results[arm.name] = TrialResult(TIMEOUT, error=f"{arm_label(arm)} did not end within the comparison's {timeout_s:.0f} s")
            continue
        results[arm.name] = read_trial_result(arm.spec, arm.result_path, arm.err_path, returncode, 0.0)
    if ended is not None:
        results[ended.name] = first
    return ("ended" if ended is not None else ""), [results[arm.name] for arm in arms]


def _report_and_keep(arm: Arm, kept_arms: KeptArms | None, deadline: float) -> TrialResult | None:
    """The report of an arm that can be kept and `measured`, which is then kept for the next comparison
    unless its report failed (a process whose loss went NaN is not measured again); None, and the arm not
    kept, where it gives no report (it is to end)."""
    if kept_arms is None or not arm.keepable or not arm.measured:
        return None
    report = arm.report(deadline)
    if report is not None and report.ok:
        kept_arms.keep(arm)
    return report


def _ended_result(arm: Arm, timeout_s: float, deadline: float) -> TrialResult:
    """The result of an arm that stopped taking turns: its own ending, or a timeout when it still runs at
    `deadline` (monotonic). An arm can stop taking turns before the deadline and still run for a while: one
    that reported a gate and then failed instead of stopping there (a DataLoader worker killed: the loader
    raises, then waits up to 5 s for its other workers) is waited for, and its failure is what it is; one
    that is stopped does not end by itself and is not waited for."""
    returncode = arm.proc.poll()
    if returncode is None and not wait_stopped(arm.proc, deadline):  # it ended meanwhile, or the deadline passed
        returncode = arm.proc.poll()
    if returncode is None:  # still running at the deadline (or stopped): it reached no gate in time
        status, why = classify_timeout(stderr_tail(arm.err_path), [])
        return TrialResult(status, error=f"{arm_label(arm)} reached no gate within the comparison's {timeout_s:.0f} s"
                           + (f": {why}" if why else ""), stderr_tail=stderr_tail(arm.err_path))
    return read_trial_result(arm.spec, arm.result_path, arm.err_path, returncode, 0.0)



# --------------------------------------------------------------------------- sequential


def _run_sequential(spec_a: TrialSpec, spec_b: TrialSpec, host: HostFacts, timeout_s: float, options: PairOptions,
                    reason: str, base_env, workdir, figure, on_round, output: ArmOutput = ArmOutput()) -> PairResult:
    """Separate runs A B A B ..., three to each of `options.sequential_rounds` rounds, each run measuring its
    share of its arm's time cap and capped by `options.run_timeout_s` (within the comparison's `timeout_s`);
    the rounds' ratios are `paired_ratios`' of their figures."""
    started = time.perf_counter()
    figure = figure or objective_figure
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
    return PairResult(SEQUENTIAL, pooled_runs(runs["a"]), pooled_runs(runs["b"]), tuple(rates["a"]), tuple(rates["b"]), "rounds",
                      reason, other_load_a=median_load(runs["a"]), other_load_b=median_load(runs["b"]),
                      usable_cores=host.usable_cores, wall_time_s=time.perf_counter() - started)
