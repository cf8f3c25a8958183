"""The trial executor: every trial a tune runs, alone or as a paired comparison, within the tune's budget.

Whatever the strategy, a trial is run here: `TrialExecutor.run` takes an `Assignment` and returns the
`TrialRecord` the study stores. A trial measured alone is one trial process (`trial.runner.run_trial`); a
trial with a `reference` is a paired comparison of that config (arm A) and its own (arm B)
(`trial.pair.run_pair`), whose arms `KeptArms` keeps, stopped, for the next comparison while
`TrialExecutor.arms_kept` holds. `Budget` is the tune's deadline: each trial's cap is cut to what is left
of it (a trial it cut is stored `budget`, not a verdict on its config), and `Budget.short_of`
judges, from the study's own comparisons, whether what is left holds the next comparison and the final one
(`Budget.short_of`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil

from torchpace.launch.command import parse_python_command
from torchpace.protocol import TIMEOUT, TrialResult, compile_allowance_s
from torchpace.script.spec import NO_STEP_MESSAGE
from torchpace.trial import TrialSpec, run_trial
from torchpace.trial.arms import KeptArms, hold_both_reason
from torchpace.trial.output import trial_log_path
from torchpace.trial.pair import run_pair
from torchpace.trial.schedule import PARTNER, PairOptions, PairResult
from torchpace.trial.script import (fitted_max_time_s, rounds_for_steps_s, sized_to_steps_s, steps_after_first,
                                    too_short_hint)
from torchpace.tune.attrs import FITTED_TRIAL_STEPS_ATTR, FITTED_TRIAL_TIME_ATTR, PairRecord, TrialRecord, stored_bench
from torchpace.tune.objective import objective_value
from torchpace.tune.options import TuneOptions
from torchpace.tune.policy import ACCEPT_FLOOR
from torchpace.tune.study import trial_records

_log = logging.getLogger(__name__)

_TRIAL_TIMEOUT_FACTOR = 3.0  # a trial may take this many times its bench cap (guard steps, compile)
_TRIAL_TIMEOUT_MARGIN_S = 60.0
# before its baseline ran, a study knows no step time: a trial may take this share of the budget (30 guard steps
# of a ResNet-18 at 1.4-2.3 s a step on a 2-core CPU outran the 84 s of an 8 s trial's cap)
_BASELINE_BUDGET_SHARE = 0.25
_FITTED_CAP_FACTOR = 2.0  # once the baseline ran, a trial may take this many times its wall time
_STORED_STDERR_CHARS = 1500
_RECENT_STEP_TIMES = 3  # a short script's trials are sized at the median step time of the latest three measurements
# what the budget counts for a study's first compile, before any comparison that compiled has shown its time: a
# first compile took 189 s (resnet small) and 102 s (gpt small) on a 2-core CPU, 13 s from the warm cache after it
_FIRST_COMPILE_S = 120.0


class Budget:
    """The tune's time: a deadline on a monotonic clock, `seconds` from now.

    Attributes:
        deadline: when the budget is spent (monotonic seconds; a test may move it).
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.deadline = clock() + seconds

    def left_s(self) -> float:
        return self.deadline - self.clock()

    @property
    def spent(self) -> bool:
        return self.left_s() <= 0

    def within(self, cap_s: float, reserve_s: float = 0.0) -> tuple[float, bool]:
        """(`cap_s` within the budget left but `reserve_s`, whether the budget cut it short)."""
        remaining = self.left_s() - reserve_s
        return max(1.0, min(cap_s, remaining)), remaining < cap_s

    def short_of(self, proposal, trials: list) -> bool:
        """Whether the budget left would not hold both `proposal`'s comparison and the final one, each taking
        as long as the study's comparisons (its Optuna `trials`, as the sampler's replay read them) of that
        kind took: a candidate's, the median of the candidates' (a second comparison of a candidate, the
        first one's: the same two configs, the same kind of comparison, which may be separate runs under
        torchrun), times the proposal's time factor (a stretched second comparison); the final one, the
        median of the A/A and final comparisons', which like it run to their CI target or the trial time. A
        proposal that compiles takes as long as the study's comparisons that compiled, or, before one has, a
        candidate's time and `_FIRST_COMPILE_S` (its compile is not in the eager comparisons' walls).
        False until a comparison has finished."""
        walls = comparison_walls(trials)
        if not walls["candidate"] and not walls["whole"]:
            return False
        first_s = walls["first"].get(proposal.slot.removeprefix("confirm-")) if proposal.slot.startswith("confirm-") else None
        typical_s = statistics.median(walls["candidate"] or walls["whole"])
        if _compile_allowance_s(proposal):
            typical_s = statistics.median(walls["compiled"]) if walls["compiled"] else typical_s + _FIRST_COMPILE_S
        candidate_s = (first_s or typical_s) * (proposal.time_factor or 1)
        final_s = statistics.median(walls["whole"] or walls["candidate"])
        return self.left_s() < candidate_s + final_s

    def final_reserve_s(self, trials: list) -> float:
        """The time a final comparison with the defaults is kept: as long as the longest of the study's A/A and
        final comparisons took (0 before one has run)."""
        return max(comparison_walls(trials)["whole"], default=0.0)


def comparison_walls(trials: list) -> dict[str, Any]:
    """The wall times of the study's comparisons that ended ok: `candidate` (a candidate's), `whole` (the A/A and
    final comparisons', run to their CI target or the trial time), `first` (each candidate's by slot), `compiled`
    (those in which an arm compiled, of any kind)."""
    walls: dict[str, Any] = {"candidate": [], "whole": [], "first": {}, "compiled": []}
    for record in trial_records(trials):
        if record.status == "ok" and record.pair is not None and record.pair.wall_time_s:
            walls["candidate" if record.assignment.kind == "candidate" else "whole"].append(record.pair.wall_time_s)
            walls["first"][record.slot] = record.pair.wall_time_s
            if _compile_allowance_s(record.assignment):
                walls["compiled"].append(record.pair.wall_time_s)
    return walls


def pair_options(kind: str, max_time_s: float) -> PairOptions:
    """How a tune's comparison of `kind` (an `Assignment.kind`) runs: its rounds take `max_time_s` with the two
    warm-ups, as a single trial's time holds its warm-up and windows; a candidate's stop once their CI is clear
    of the gain it must show to be kept (or clearly under it), while the A/A and the final comparison estimate a
    figure, and run to the CI target or the time."""
    return PairOptions(rounds_s=max_time_s, decide_at=1 + ACCEPT_FLOOR if kind == "candidate" else None,
                       warmups_count=True)


def cut_by_the_budget(result: TrialResult, cap_cut_short: bool) -> bool:
    """Whether the budget ended `result`'s trial: its cap was cut short by the budget and the trial ran into that
    cap (killed there, with no result of its own: no exit status), or a script's hook gave up waiting for its
    first step at that shortened cap (its no-step wait is the cap's, less a margin: which of the two ends first
    is the host's speed). A timeout the trial wrote itself after steps (a script's hook ending a stall, or its
    measurement's cap with too few windows) is a verdict on its config, whatever the budget, and a script that
    ended by itself was not cut."""
    if not cap_cut_short or result.status != TIMEOUT:
        return False
    return result.returncode is None or result.error.startswith(NO_STEP_MESSAGE)


def candidate_result(pair: PairResult, cut_by_budget: bool) -> TrialResult:
    """The candidate's result of a paired comparison, as stored: when the budget cut the comparison and
    the reference arm ran out of that time (timeout), the candidate was not judged for the budget's sake,
    not its partner's: it is cut too (stored as `budget`, run again on --resume), not `partner`."""
    if pair.b.status == PARTNER and cut_by_the_budget(pair.a, cut_by_budget):
        return replace(pair.b, status=TIMEOUT)
    return pair.b


def restart_command(study_name: str, command: tuple[str, ...]) -> str:
    """The command that starts a tune of the script `command` again as a new study (a study without a baseline
    cannot go on)."""
    return shlex.join(["torchpace", "tune", "--study", f"{study_name}-2", "--", *command])


class TrialExecutor:
    """Runs the trials of one tune (see the module docstring).

    Args:
        options: the tune's options (what every trial runs with).
        host: this host's facts.
        spec: the workload spec, or the script command as one string.
        is_inference: the workload is an inference one (its trials carry the accuracy guard).
        study: the Optuna study (its trials, and its user attribute of a trial time fitted to a short script).
        study_name: its name (script mode: the folder of the trials' logs).
        budget: the tune's `Budget`.
        on_event: progress: `trial_start`, `round`, `notice`.
        keep_final_time: a candidate compared with a config kept so far is capped so that the time of the final
            comparison with the defaults is left (`Budget.final_reserve_s`): a tune its budget stops still
            measures its speedup (the strategy's `keeps_final_time`).
    """

    def __init__(self, options: TuneOptions, host, spec: str, is_inference: bool, study, study_name: str, budget: Budget,
                 on_event: Callable[..., None], keep_final_time: bool = False):
        self.options, self.host, self.spec, self.is_inference = options, host, spec, is_inference
        self.keep_final_time = keep_final_time
        self.study, self.study_name, self.budget, self.on_event = study, study_name, budget, on_event
        self.trial_time_s = options.trial_time_s
        self._kept_arms: KeptArms | None = None  # while trials run: the last comparison's arms, for the next one
        fitted = study.user_attrs.get(FITTED_TRIAL_TIME_ATTR)
        self.fitted_steps: int | None = study.user_attrs.get(FITTED_TRIAL_STEPS_ATTR)
        if fitted is not None and fitted < options.trial_time_s:  # sized to a short script when its baseline ran
            self.trial_time_s = float(fitted)
            on_event("notice", message=f"the trials of study {study_name!r} measure for {fitted:g} s, sized to the "
                                       f"script when its baseline ran (not --trial-time {options.trial_time_s:g})")

    @contextlib.contextmanager
    def arms_kept(self) -> Iterator[None]:
        """While the block runs, a comparison's arms are kept, stopped, for the next one (the incumbent is the
        next reference); all are ended when it ends, however."""
        with KeptArms() as self._kept_arms:
            try:
                yield
            finally:
                self._kept_arms = None

    # ---- one trial ------------------------------------------------------------------------------
    def run(self, number: int, assignment) -> TrialRecord:
        """Run trial `number` as `assignment` says (one process, or a paired comparison); its `TrialRecord`
        (what is stored on the Optuna trial)."""
        _log.info("trial %d (%s) starts: %s", number, assignment.slot, dict(assignment.config) or "the defaults")
        self.on_event("trial_start", number=number, assignment=assignment, budget_left_s=self.budget.left_s())
        log = trial_log_path(self.study_name, number) if self.options.command else None
        if assignment.reference is not None:
            return self._run_pair(number, assignment, log)
        result, cut_by_budget = self._run_single(assignment, log)
        fitted = fitted_max_time_s(result, self.trial_time_s) if assignment.slot == "baseline" else None
        if fitted is not None:  # the script ends sooner than a trial measures: every trial is sized to it
            self._fit_trial_time(fitted, result)
            result, cut_by_budget = self._run_single(assignment, log)
        return self._stored(number, assignment, result, cut_by_budget, log)

    def trial_spec(self, assignment) -> tuple[TrialSpec, float, bool]:
        """(the TrialSpec of `assignment`'s config, its cap in seconds, whether the budget cut that cap short).
        Its trial time (`max_time_s`) is the tune's, times the policy's factor for it (a stretched second
        comparison)."""
        factor = assignment.time_factor or 1
        trial_time_s = self.sized_trial_time_s() * factor
        o = self.options
        spec = TrialSpec(workload=self.spec, config=dict(assignment.config), max_time_s=trial_time_s,
                         guard_steps=o.guard_steps, sys_path=[os.getcwd()],
                         profile=o.profile_baseline and assignment.slot == "baseline" and not o.command,
                         command=list(o.command), samples_per_step=o.samples_per_step,
                         compile_allowance_s=_compile_allowance_s(assignment), script_ranks=self.script_ranks(),
                         **self._inference_spec())
        cap_s = self.cap_s(assignment, trial_time_s, comparison=assignment.reference is not None)
        return (spec, *self.budget.within(cap_s, self._reserve_s(assignment)))

    def sized_trial_time_s(self) -> float:
        """The trial time: the tune's, or for a script that ends before a trial could measure it, the share of the
        time its steps take at the step time of the study's latest trials (`sized_to_steps_s`), so that it follows
        the host's pace as the tune goes; the time fitted when its baseline ran until a trial measured a step time."""
        step_s = self._script_step_s()
        sized = sized_to_steps_s(self.fitted_steps, step_s, self.options.trial_time_s) if step_s else None
        if sized is not None:
            _log.info("the trial measures for %g s: %d steps of the script at %.3g s each, its latest trials' pace",
                      sized, self.fitted_steps, step_s)
        return sized or self.trial_time_s

    def _script_step_s(self) -> float | None:
        """A script that ends before a trial could measure it: the median step time of the study's latest trials
        (each arm of a comparison), None before one measured it or for any other study."""
        if not self.fitted_steps:
            return None
        step_times = [bench.throughput.step_time_s for record in trial_records(self.study.get_trials(deepcopy=False))
                      if record.status == "ok"
                      for bench in (record.bench, record.pair.reference_bench if record.pair else None)
                      if bench is not None and bench.throughput.step_time_s]
        return statistics.median(step_times[-_RECENT_STEP_TIMES:]) if step_times else None

    def _reserve_s(self, assignment) -> float:
        """The budget kept back from `assignment`: the final comparison's time, for a candidate compared with a
        config kept so far (a final comparison will follow it) when `keep_final_time`; else none."""
        if not (self.keep_final_time and assignment.kind == "candidate" and assignment.reference):
            return 0.0
        return self.budget.final_reserve_s(self.study.get_trials(deepcopy=False))

    def cap_s(self, assignment, max_time_s: float, comparison: bool = False) -> float:
        """The cap of one trial process of `assignment` that measures for `max_time_s` (`comparison`: of its
        paired comparison, two processes in turns): the --trial-timeout given for the tune's trial time
        (stretched with it), else its time x 3 + 60 s and a compile allowance, or more where the study's own
        trials say its steps need it: before the baseline has run, a share of the budget (its guard steps at a
        step of seconds: a ResNet on a CPU), after it, twice the baseline's wall time (start-up, guard steps,
        warm-up and windows, at this workload's real step time); for a comparison, twice the longest of the
        study's comparisons or of two baselines (a ResNet-18's comparisons on a 2-core CPU took 50-60 s, and
        under other load outran the 84 s of an 8 s trial's cap)."""
        factor = assignment.time_factor or 1
        if self.options.trial_timeout_s:
            return self.options.trial_timeout_s * factor
        compile_s = _compile_allowance_s(assignment)
        cap_s = max_time_s * _TRIAL_TIMEOUT_FACTOR + _TRIAL_TIMEOUT_MARGIN_S + compile_s
        baseline_s = self.baseline_wall_s()
        if baseline_s is None:
            return max(cap_s, self.options.budget_s * _BASELINE_BUDGET_SHARE) if assignment.kind == "baseline" else cap_s
        fitted_s = baseline_s
        if comparison:
            walls = comparison_walls(self.study.get_trials(deepcopy=False))
            fitted_s = max([2 * baseline_s, *walls["candidate"], *walls["whole"]])
        return max(cap_s, fitted_s * _FITTED_CAP_FACTOR * factor + compile_s)

    def script_ranks(self) -> int | None:
        """The processes of the script's job: its launcher's options say, else the study's baseline measured them
        (None for a workload, or before either says)."""
        if not self.options.command:
            return None
        launcher = parse_python_command(self.options.command).launcher
        if launcher is not None and launcher.world_size:
            return launcher.world_size
        records = trial_records(self.study.get_trials(deepcopy=False))
        bench = next((r.bench for r in records if r.slot == "baseline" and r.status == "ok" and r.bench), None)
        return bench.step.world_size if bench is not None else None

    def baseline_wall_s(self) -> float | None:
        """Wall seconds of this study's baseline trial that ran to its result (None before it has)."""
        records = trial_records(self.study.get_trials(deepcopy=False))
        return next((r.wall_time_s for r in records if r.slot == "baseline" and r.status == "ok" and r.wall_time_s), None)

    def _run_single(self, assignment, log: Path | None) -> tuple[TrialResult, bool]:
        """(result, cut by the budget) of one trial process."""
        spec, timeout_s, cut_by_budget = self.trial_spec(assignment)
        result = run_trial(spec, self.host, timeout_s=timeout_s, log_path=log, echo=self._echo())
        return result, cut_by_budget

    def _echo(self):
        return sys.stderr if self.options.show_output else None

    def _stored(self, number: int, assignment, result, cut_by_budget: bool, log: Path | None) -> TrialRecord:
        """The `TrialRecord` of `result` (the candidate's, for a paired comparison), as stored on the trial.
        A trial the budget ended is `budget`, said as such: not a verdict on its config (`--resume` runs it)."""
        status, error = result.status, result.error[-_STORED_STDERR_CHARS:]
        if cut_by_the_budget(result, cut_by_budget):
            status = "budget"
            error = ("cut by the tune's budget before the trial's own cap: not a verdict on its config "
                     "(`--resume` with a larger --budget runs it again)")
        elif result.ended_after and status != "ok" and self.options.command:
            error += f"; {too_short_hint(result, '--trial-time')}"
            if assignment.slot == "baseline":
                error += f"; then start a new study: {restart_command(self.study_name, self.options.command)}"
        if log is not None and status != "ok" and log.exists():
            error += f" (the script's output: {log})"
        _log.info("trial %d (%s) ended %s, wall time %.1f s%s", number, assignment.slot, status, result.wall_time_s,
                  f": {error.strip().splitlines()[-1]}" if error.strip() else "")
        bench = result.bench
        record = TrialRecord(
            number, "RUNNING", assignment=assignment, status=status,
            bench=stored_bench(bench) if bench is not None else None,
            usable_cores=self.host.usable_cores if bench is not None else None,  # other_load_cores is out of these
            guard_losses=tuple(result.guard_losses), guard_metric=result.guard_metric, verdict=result.verdict,
            error=error, stderr_tail=result.stderr_tail[-_STORED_STDERR_CHARS:],
            wall_time_s=result.wall_time_s, accuracy=result.accuracy or (bench.accuracy if bench is not None else None),
            output_log=str(log) if log is not None else None)
        return record.measured(self.options.objective)

    # ---- a paired comparison --------------------------------------------------------------------
    def _run_pair(self, number: int, assignment, log: Path | None) -> TrialRecord:
        """A paired comparison: the candidate (`assignment.config`, arm B) and `assignment.reference` (arm A) in
        alternation (`torchpace.trial.pair`); the candidate's record, with the comparison under `pair`. In
        script mode each arm's output is kept: the candidate's in the trial's log, the reference's beside it."""
        spec, timeout_s, cut_by_budget = self.trial_spec(assignment)
        reference = replace(spec, config=dict(assignment.reference), guard_steps=0, profile=False)
        candidate = replace(spec, profile=False)
        logs = (log.with_name(f"{log.stem}-reference.log"), log) if log is not None else (None, None)
        kept = self._kept_arms
        if kept is not None and not assignment.reference:  # the final comparison measures the defaults again
            kept.hold(reference)
        if kept is not None and assignment.kind == "final":  # and the tuned config in a fresh process
            kept.end_serving(candidate)
        options = self.pair_options(assignment, spec.max_time_s)

        def separate_runs_cap_s() -> float:  # each run capped as a trial of its share of the time would be
            nonlocal cut_by_budget  # whether the budget cut the cap the comparison ended under
            cap_s, cut_by_budget = self.budget.within(options.separate_runs_timeout_s, self._reserve_s(assignment))
            return cap_s

        sequential = self._hold_both_reason(reference, candidate)
        if sequential:
            timeout_s = separate_runs_cap_s()
        pair = run_pair(reference, candidate, self.host, timeout_s, options, sequential=sequential,
                        figure=lambda bench: objective_value(bench, self.options.objective)[0],
                        on_round=lambda rounds, summary: self.on_event("round", number=number, rounds=rounds,
                                                                       summary=summary),
                        logs=logs, echo=self._echo(), kept_arms=kept, fallback_timeout_s=separate_runs_cap_s)
        record = self._stored(number, assignment, candidate_result(pair, cut_by_budget), cut_by_budget, log)
        ref_value, _ = objective_value(pair.a.bench, self.options.objective)
        s = pair.summary
        return replace(record, pair=PairRecord(
            mode=pair.mode, mode_reason=pair.mode_reason, stopped_by=pair.stopped_by, ratios=tuple(pair.ratios),
            ratio=s.median if s else None, ratio_ci_low=s.ci_low if s else None, ratio_ci_high=s.ci_high if s else None,
            ratio_ci_coverage=s.ci_coverage if s else None, rounds=s.n if s else 0, other_load_a=pair.other_load_a,
            other_load_b=pair.other_load_b, usable_cores=pair.usable_cores, wall_time_s=pair.wall_time_s,
            reference_status=pair.a.status, reference_error=pair.a.error[-_STORED_STDERR_CHARS:], reference_value=ref_value,
            reference_bench=stored_bench(pair.a.bench) if pair.a.bench is not None else None, reused=pair.reused))

    def pair_options(self, assignment, max_time_s: float) -> PairOptions:
        """How `assignment`'s comparison runs (`pair_options`), a separate run capped as a trial of its share of
        the time would be."""
        options = pair_options(assignment.kind, max_time_s)
        if (step_s := self._script_step_s()) is not None:  # a script that ends: its end, not a share of it, ends them
            options = replace(options, rounds_s=rounds_for_steps_s(self.fitted_steps, step_s, max_time_s,
                                                                   self.options.trial_time_s * (assignment.time_factor or 1)))
        return replace(options, run_timeout_s=self.cap_s(assignment, options.run_time_s(max_time_s)))

    def _hold_both_reason(self, reference: TrialSpec, candidate: TrialSpec) -> str | None:
        """Why the two arms cannot be held at once (`torchpace.trial.arms.hold_both_reason`), judged by the
        baseline's peak memory times the arms to start (an arm kept from before holds its memory already)
        against the memory free now on its device; None when they can."""
        records = trial_records(self.study.get_trials(deepcopy=False))
        baseline = next((r.bench for r in records if r.slot == "baseline" and r.status == "ok" and r.bench), None)
        peak = baseline.peak_memory_bytes if baseline else None
        kind = baseline.peak_memory_kind if baseline else ""
        return hold_both_reason(reference, candidate, self._kept_arms, peak, lambda: _free_memory_bytes(kind or ""))

    # ---- a script that ends early ---------------------------------------------------------------
    def _fit_trial_time(self, fitted: float, result) -> None:
        """Measure every trial of this study (also after --resume) for `fitted` seconds, and say why."""
        ended = result.ended_after
        self.on_event("notice", message=(
            f"the script ended {ended['seconds']:.1f} s after its first step, before {ended['windows']} measured "
            f"window(s) became enough: every trial of study {self.study_name!r} now measures for {fitted:g} s "
            f"(as `--trial-time {fitted:g}`)"))
        self.trial_time_s = fitted
        self.study.set_user_attr(FITTED_TRIAL_TIME_ATTR, fitted)
        self.fitted_steps = steps_after_first(result)
        self.study.set_user_attr(FITTED_TRIAL_STEPS_ATTR, self.fitted_steps)

    def _inference_spec(self) -> dict[str, Any]:
        """TrialSpec fields for the objective and, for inference workloads, the accuracy guard (they have no loss curve)."""
        if not self.is_inference:
            return {"objective": self.options.objective}
        o = self.options
        return {"objective": o.objective, "accuracy_batches": o.accuracy_batches,
                "accuracy_rtol": o.accuracy_rtol, "accuracy_atol": o.accuracy_atol, "min_top1_agreement": o.min_top1_agreement}


def _compile_allowance_s(assignment) -> float:
    """The compile allowance of `assignment`'s trials (an `Assignment` or a policy `Proposal`; both arms of a
    comparison: the longer one): what its specs carry to the script's stall watchdog and what its caps add."""
    return compile_allowance_s({**(assignment.reference or {}), **assignment.config})


def _free_memory_bytes(kind: str) -> int | None:
    """Memory free now where a trial's peak was measured: the current CUDA device for a `cuda*` peak, else
    the host's available memory (None when unreadable)."""
    if kind.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None

    return psutil.virtual_memory().available
