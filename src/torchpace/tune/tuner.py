"""`run_tune`: the study loop. Each trial runs in its own process (`torchpace.trial`), its result
is stored on the Optuna trial, and the strategy (greedy by default) picks the next one. At the end,
or when the budget runs out or the user presses Ctrl-C, the best config so far is written.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import psutil

from torchpace.config import RunConfig, save_config
from torchpace.errors import UsageError
from torchpace.files import OutputWriteFailed, own_folder
from torchpace.knobs import REGISTRY
from torchpace.launch.command import parse_python_command
from torchpace.protocol import TIMEOUT, TrialResult, check_eval_batches, compile_allowance_s
from torchpace.redact import redact_url
from torchpace.script.knobs import script_target
from torchpace.script.spec import NO_STEP_MESSAGE
from torchpace.trial import TrialSpec, run_trial
from torchpace.trial.output import trial_log_path
from torchpace.trial.pair import PARTNER, KeptArms, PairOptions, PairResult, hold_both_reason, run_pair
from torchpace.trial.script import (fitted_max_time_s, rounds_for_steps_s, sized_to_steps_s, steps_after_first,
                                    too_short_hint)
from torchpace.tune.attrs import (ATTR, FITTED_TRIAL_STEPS_ATTR, FITTED_TRIAL_TIME_ATTR, Assignment, PairRecord, StudyAttrs, TrialRecord,
                                  interrupted_attrs, stored_bench)
from torchpace.tune.figures import result_table
from torchpace.tune.guard import check_guard_steps
from torchpace.tune.objective import check_objective, objective_value
from torchpace.tune.outcome import ExportOutcome, StudyMeta, TuneOutcome, build_guard_note, build_outcome, trial_rows
from torchpace.tune.policy import ACCEPT_FLOOR
from torchpace.tune.space import KnobSpace, build_space
from torchpace.tune.storage import StorageFailed, check_storage, default_storage_url, open_storage, storage_failures
from torchpace.tune.study import fail_stale_trials, open_study, study_metadata, trial_records, tuner_process
from torchpace.workload import DEFAULT_WORKLOAD, load_workload

_log = logging.getLogger(__name__)

STRATEGIES = ("greedy", "tpe", "random", "grid")
_WAIT_POLL_S = 2.0  # how often a waiting worker looks for a free trial
_TRIAL_TIMEOUT_FACTOR = 3.0  # a trial may take this many times its bench cap (guard steps, compile)
_TRIAL_TIMEOUT_MARGIN_S = 60.0
# before its baseline ran, a study knows no step time: a trial may take this share of the budget (30 guard steps
# of a ResNet-18 at 1.4-2.3 s a step on a 2-core CPU outran the 84 s of an 8 s trial's cap)
_BASELINE_BUDGET_SHARE = 0.25
_FITTED_CAP_FACTOR = 2.0  # once the baseline ran, a trial may take this many times its wall time
_STORED_STDERR_CHARS = 1500
_NOT_A_VERDICT = ("ok", "budget", "interrupted")
_RECENT_STEP_TIMES = 3  # a short script's trials are sized at the median step time of the latest three measurements  # trial statuses that leave a baseline usable or to be run again


@dataclass(frozen=True)
class TuneOptions:
    """Everything `torchpace tune` takes. Times in seconds."""

    workload: str | None = None
    command: tuple[str, ...] = ()  # script mode: the unmodified training command (`python train.py ARGS`)
    samples_per_step: int | None = None  # script mode: when the script's batches do not tell
    show_output: bool = False  # script mode: stream each trial's output to stderr (it is kept in a log either way)
    budget_s: float = 900.0
    max_trials: int | None = None
    strategy: str = "greedy"
    storage: str | None = None
    study: str | None = None
    resume: bool = False
    out: Path = Path("torchpace.toml")
    guard_steps: int = 30
    trial_time_s: float = 20.0
    knobs: frozenset[str] | None = None  # restrict the search to these knobs
    seed: int = 0
    trial_timeout_s: float | None = None  # default: trial_time_s * 3 + 60 (guard steps, compile)
    profile_baseline: bool = True  # profile the baseline; its verdict picks the stage tried first
    objective: str = "throughput"  # or "latency": batch-1 p50 of an inference workload (see tune.objective)
    # inference workloads: the accuracy guard (torchpace.inference.accuracy) and the exported model
    accuracy_batches: int = 4  # batches compared with the fp32 eager reference (0: no accuracy guard)
    accuracy_rtol: float = 0.05  # max abs error allowed, relative to the largest reference output
    accuracy_atol: float = 1e-5
    min_top1_agreement: float = 0.99  # classifiers: share of samples whose argmax must match
    export_path: Path | None = None  # write the chosen model here (torch.export .pt2 or TorchScript)


def _worker_id() -> str:
    """host:pid of this tuner process, stored on each trial (several tuners may share a study)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _TrialFailed(Exception):
    """A trial ended with a failure class (a result, not an error of the tuner)."""


def make_conflicts(space: list[KnobSpace]) -> Callable[[dict], str | None]:
    """A function: config -> why the tuner must not run it (a knob conflict, e.g. prefetch without
    workers, or a config that cannot gain, e.g. DDP in one process), or None."""
    defaults = {knob_space.name: knob_space.default for knob_space in space}  # the workload's own included

    def conflicts(config: dict) -> str | None:
        values = RunConfig(config).with_defaults(defaults).full_values()
        for knob_space in space:
            knob = REGISTRY[knob_space.name]
            reason = knob.conflicts(values) or knob.pointless(values)
            if reason:
                return reason
        return None

    return conflicts


def make_sampler(strategy: str, space: list[KnobSpace], conflicts, seed: int):
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    # lazy: optuna (hundreds of ms) loads only when a study is opened
    from torchpace.tune.sampler import GreedySampler

    if strategy == "greedy":
        return GreedySampler(space, conflicts)
    if strategy == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if strategy == "grid":
        return optuna.samplers.GridSampler({k.name: list(k.values) for k in space}, seed=seed)
    raise UsageError(f"--strategy {strategy!r} is not valid; valid strategies: {', '.join(STRATEGIES)}")


def _is_done(state) -> bool:
    """Whether greedy's replayed `state` has nothing left to run: every knob decided, or the final comparison
    run early for the budget (`GreedySampler.plan`), or a failed baseline (None, another strategy: never)."""
    return state is not None and (state.done or bool(state.failed_baseline))


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

class Tuner:
    """Runs one tune session against a study (several sessions may share the study)."""

    def __init__(self, options: TuneOptions, host, on_event: Callable[..., None] | None = None):
        # lazy: optuna (hundreds of ms) loads only when a study is opened
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)  # torchpace renders its own progress

        if options.strategy not in STRATEGIES:
            raise UsageError(f"--strategy {options.strategy!r} is not valid; valid strategies: {', '.join(STRATEGIES)}")
        check_guard_steps(options.guard_steps)
        check_eval_batches(options.accuracy_batches)
        self.options, self.host = options, host
        self.write_failure: OutputWriteFailed | None = None  # --out could not be written (the outcome is still reported)
        self.on_event = on_event or (lambda kind, **data: None)
        self.storage_url = options.storage or default_storage_url()
        # before the workload is built: a storage that cannot be used is refused with nothing started or written
        check_storage(self.storage_url, on_wait=lambda message: self.on_event("notice", message=message))
        self.spec = shlex.join(options.command) if options.command else options.workload or DEFAULT_WORKLOAD
        workload = self._target()
        self.workload_name = workload.name
        self.is_inference = not workload.is_training
        check_objective(options.objective, workload.is_training, self.spec)
        if options.export_path is not None and (workload.is_training or options.command):
            raise UsageError(f"--export writes an optimized inference model, and {self.spec!r} trains (its Workload has "
                             "a loss); export applies to inference workloads (loss=None), e.g. the built-in `inference`")
        self.space = build_space(host, workload, only=options.knobs, objective=options.objective,
                                 script=bool(options.command))
        self.conflicts = make_conflicts(self.space)
        self.sampler = make_sampler(options.strategy, self.space, self.conflicts, options.seed)
        suffix = "-latency" if options.objective == "latency" else ""
        self.study_name = options.study or f"torchpace-{self.workload_name}{suffix}"
        if options.command:  # the trials' log folder, before the study exists: one that cannot be made is refused first
            own_folder(trial_log_path(self.study_name, 0).parent)
        meta = study_metadata(self.spec, host, options.strategy, options.objective,
                              tuple(options.command) if options.command else None,
                              defaults={k.name: k.default for k in self.space if k.default != REGISTRY[k.name].default})
        with storage_failures(self.storage_url):
            self.study = open_study(open_storage(self.storage_url), self.study_name, meta, options.resume, self.sampler)
            fitted = self.study.user_attrs.get(FITTED_TRIAL_TIME_ATTR)
            self.fitted_steps: int | None = self.study.user_attrs.get(FITTED_TRIAL_STEPS_ATTR)
        self.trial_time_s = options.trial_time_s
        self._kept_arms: KeptArms | None = None  # while trials run: the last comparison's arms, for the next one
        if fitted is not None and fitted < options.trial_time_s:  # sized to a short script when its baseline ran
            self.trial_time_s = float(fitted)
            self.on_event("notice", message=f"the trials of study {self.study_name!r} measure for {fitted:g} s, sized "
                                            f"to the script when its baseline ran (not --trial-time {options.trial_time_s:g})")
        if options.strategy == "greedy":  # a study tuned before (paired comparisons, a revision) goes on as it was tuned
            stored = StudyAttrs.of(self.study)
            self.sampler.paired, self.sampler.revision = stored.paired, stored.greedy_revision
            self.sampler.budget_short = self._budget_short
        _log.info("study %r: %d trials stored; strategy %s over %s; budget %.0f s", self.study_name,
                  len(self.study.get_trials(deepcopy=False)), options.strategy, [k.name for k in self.space], options.budget_s)
        self.deadline = time.monotonic() + options.budget_s

    def _target(self):
        """The Workload to tune, or for script mode what the knobs can know of the script before it runs."""
        if not self.options.command:
            return load_workload(self.spec)

        program = parse_python_command(self.options.command)
        return script_target(Path(program.script).name if program.script else str(program.module))

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> TuneOutcome:
        """Run trials until the strategy is done, the budget or trial cap is reached, or Ctrl-C."""
        stopped = "done"
        try:
            with storage_failures(self.storage_url):
                fail_stale_trials(self.study)  # a tuner killed before this --resume: its trial is run again
                self._say_where_output_goes()
                self._say_how_to_restart()
                self._enqueue_baseline()
                if not self._search_done():
                    # a comparison's arms are kept, stopped, for the next one: the incumbent is the next reference
                    with KeptArms() as self._kept_arms:
                        self.study.optimize(self._objective, n_trials=self.options.max_trials,
                                            timeout=self.options.budget_s, catch=(_TrialFailed,), callbacks=[self._after_trial])
                    self._kept_arms = None
                    state = self._search_state()
                    done = _is_done(state)
                    stopped = "done" if done else self._why_stopped()
                    if state is not None and state.left_undecided:  # time was kept for the final comparison, not every knob
                        stopped = "budget"
                        final = ("held one more comparison, so the config kept so far was compared with the defaults"
                                 if done else "ran out before the config kept so far was compared with the defaults")
                        self.on_event("notice", message=(
                            f"the budget left {final}; not decided: {', '.join(state.left_undecided)} (`--resume` "
                            "with a larger --budget decides them)"))
        except KeyboardInterrupt:
            stopped = "interrupted"
            raise
        except StorageFailed:
            stopped = "storage failed"
            raise
        finally:
            self.outcome = self._finish_after(stopped)
        return self.outcome

    def _finish_after(self, stopped: str) -> TuneOutcome | None:
        """`_finish`, its storage failure as one message; after a storage failure already raised, the best
        so far only if the storage can still be read (else None: a second message would only repeat it)."""
        try:
            with storage_failures(self.storage_url):
                return self._finish(stopped)
        except StorageFailed:
            if stopped == "storage failed":
                return None
            raise

    def _say_where_output_goes(self) -> None:
        if self.options.command:
            folder = trial_log_path(self.study_name, 0).parent
            self.on_event("notice", message=f"each trial's script output is kept in {folder}/trial-N.log"
                                            + ("" if self.options.show_output else " (--show-output streams it)"))

    def _say_how_to_restart(self) -> None:
        """`--resume` of a study whose baseline failed: nothing can be compared with it, so say how to start over."""
        records = trial_records(self.study.get_trials(deepcopy=False))
        baseline = next((r for r in records if r.slot == "baseline" and r.status), None)
        if baseline is None or baseline.status in _NOT_A_VERDICT:
            return
        why = baseline.error.strip() or baseline.status
        restart = self._restart_command() if self.options.command else (
            shlex.join(["torchpace", "tune", "--study", f"{self.study_name}-2", self.spec]))  # a name may hold spaces
        self.on_event("notice", message=f"study {self.study_name!r} cannot go on: its baseline failed "
                                        f"({why.splitlines()[-1]}); after changing what failed, start a new "
                                        f"study: {restart}")

    def _why_stopped(self) -> str:
        if time.monotonic() >= self.deadline:
            return "budget"
        return "max-trials" if self.options.max_trials else "done"

    def _budget_short(self, proposal, trials) -> bool:
        """Whether the budget left would not hold both `proposal`'s comparison and the final one, each taking
        as long as the study's comparisons (its Optuna `trials`, as the sampler's replay read them) of that
        kind took: a candidate's, the median of the candidates' (a second comparison of a candidate, the
        first one's: the same two configs, the same kind of comparison, which may be separate runs under
        torchrun), times the proposal's time factor (a stretched second comparison); the final one, the
        median of the A/A and final comparisons', which like it run to their CI target or the trial time.
        False until a comparison has finished."""
        walls = {"candidate": [], "whole": []}
        first_s = None  # the first comparison of the candidate `proposal` compares again
        for record in trial_records(trials):
            if record.status == "ok" and record.pair is not None and record.pair.wall_time_s:
                walls["candidate" if record.assignment.kind == "candidate" else "whole"].append(record.pair.wall_time_s)
                if proposal.slot.startswith("confirm-") and record.slot == proposal.slot.removeprefix("confirm-"):
                    first_s = record.pair.wall_time_s
        if not walls["candidate"] and not walls["whole"]:
            return False
        candidate_s = (first_s or statistics.median(walls["candidate"] or walls["whole"])) * (proposal.time_factor or 1)
        final_s = statistics.median(walls["whole"] or walls["candidate"])
        return self.deadline - time.monotonic() < candidate_s + final_s

    def _enqueue_baseline(self) -> None:
        if self.options.strategy == "greedy" or self.study.get_trials(deepcopy=False):
            return
        defaults = {k.name: k.default for k in self.space}
        self.study.enqueue_trial(defaults, user_attrs={ATTR: Assignment(slot="baseline", kind="baseline").to_attrs()})

    def _search_state(self):
        """Greedy's state replayed from the study (`GreedySampler.plan`); None for the other strategies."""
        return self.sampler.plan(self.study) if self.options.strategy == "greedy" else None

    def _search_done(self) -> bool:
        return _is_done(self._search_state())

    def _after_trial(self, study, trial) -> None:
        # Optuna's own timeout counts from `optimize`, after this tuner's set-up: past the budget, every
        # trial it would still start is cut at once (a stored `budget` trial each, seen 14 in a row)
        if self._search_done() or time.monotonic() >= self.deadline:
            study.stop()

    def _objective(self, trial) -> float:
        # lazy: optuna (hundreds of ms) loads only when a study is opened
        import optuna

        if self.options.strategy == "greedy":
            assignment = self._await_assignment(trial)
        else:
            assignment = TrialRecord.from_trial(self.study._storage.get_trial(trial._trial_id)).assignment
        if assignment.action == "done":
            self.study.stop()
            raise optuna.TrialPruned("the search is complete")
        config = {k.name: trial.suggest_categorical(k.name, list(k.values)) for k in self.space}
        if self.options.strategy == "greedy":  # the proposal's config as the policy made it: a value equal to a knob's
            config = dict(assignment.config)   # default there replaces a script's own setting
        else:
            config = {k.name: config[k.name] for k in self.space if config[k.name] != k.default}
        assignment = replace(assignment, slot=assignment.slot or f"trial:{trial.number}",
                             kind=assignment.kind or "candidate", config=config, worker=_worker_id(),
                             process=tuner_process())
        self.study._storage.set_trial_system_attr(trial._trial_id, ATTR, assignment.to_attrs())
        try:
            result = self._run_one(trial.number, assignment)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: say so on the trial, which --resume runs again
            trial.set_user_attr(ATTR, interrupted_attrs())
            raise
        trial.set_user_attr(ATTR, result.result_attrs())
        self.on_event("trial_done", number=trial.number, assignment=assignment, result=result)
        if result.status != "ok":
            raise _TrialFailed(result.status)
        if result.objective_value is None:
            raise _TrialFailed(f"the trial measured no {self.options.objective} figure")
        return float(result.objective_value)

    def _await_assignment(self, trial):
        """Greedy: the proposal pinned on this trial, waiting while other processes hold every pending trial."""
        while True:
            frozen = self.study._storage.get_trial(trial._trial_id)
            assignment = TrialRecord.from_trial(frozen).assignment
            if assignment.action != "wait":
                return assignment
            if time.monotonic() >= self.deadline:
                return replace(assignment, action="done")
            self.on_event("waiting")
            time.sleep(_WAIT_POLL_S)
            fail_stale_trials(self.study)  # a killed tuner's trial: failed, then run again
            self.sampler.assign(self.study, frozen)

    def _run_one(self, number: int, assignment):
        """Run one trial (one process, or a paired comparison); returns its `TrialRecord` (what is stored
        on the Optuna trial)."""
        reason = self.conflicts(dict(assignment.config))
        if reason:
            _log.info("trial %d (%s) not run: %s", number, assignment.slot, reason)
            return TrialRecord(number, "RUNNING", assignment=assignment, status="invalid", error=reason)
        _log.info("trial %d (%s) starts: %s", number, assignment.slot, dict(assignment.config) or "the defaults")
        self.on_event("trial_start", number=number, assignment=assignment, budget_left_s=self.deadline - time.monotonic())
        log = trial_log_path(self.study_name, number) if self.options.command else None
        if assignment.reference is not None:
            return self._run_pair(number, assignment, log)
        result, cut_by_budget = self._run_single(assignment, log)
        fitted = fitted_max_time_s(result, self.trial_time_s) if assignment.slot == "baseline" else None
        if fitted is not None:  # the script ends sooner than a trial measures: every trial is sized to it
            self._fit_trial_time(fitted, result)
            result, cut_by_budget = self._run_single(assignment, log)
        return self._stored(number, assignment, result, cut_by_budget, log)

    def _trial_spec(self, assignment):
        """(the TrialSpec of `assignment`'s config, its cap in seconds, whether the budget cut that cap short).
        Its trial time (`max_time_s`) is the tune's, times the policy's factor for it (a stretched second
        comparison)."""
        factor = assignment.time_factor or 1
        trial_time_s = self._sized_trial_time_s() * factor
        spec = TrialSpec(workload=self.spec, config=dict(assignment.config), max_time_s=trial_time_s,
                         guard_steps=self.options.guard_steps, sys_path=[os.getcwd()],
                         profile=self.options.profile_baseline and assignment.slot == "baseline" and not self.options.command,
                         command=list(self.options.command), samples_per_step=self.options.samples_per_step,
                         compile_allowance_s=_compile_allowance_s(assignment), **self._inference_spec())
        return (spec, *self._within_budget(self._cap_s(assignment, trial_time_s)))

    def _sized_trial_time_s(self) -> float:
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

    def _cap_s(self, assignment, max_time_s: float) -> float:
        """The cap of one trial process of `assignment` that measures for `max_time_s`: the --trial-timeout
        given for the tune's trial time (stretched with it), else its time x 3 + 60 s and a compile allowance,
        or more where the study's own baseline says its steps need it: before the baseline has run, a share of
        the budget (its guard steps at a step of seconds: a ResNet on a CPU), after it, twice the baseline's
        wall time (start-up, guard steps, warm-up and windows, at this workload's real step time)."""
        factor = assignment.time_factor or 1
        if self.options.trial_timeout_s:
            return self.options.trial_timeout_s * factor
        compile_s = _compile_allowance_s(assignment)
        cap_s = max_time_s * _TRIAL_TIMEOUT_FACTOR + _TRIAL_TIMEOUT_MARGIN_S + compile_s
        baseline_s = self._baseline_wall_s()
        if baseline_s is None:
            return max(cap_s, self.options.budget_s * _BASELINE_BUDGET_SHARE) if assignment.kind == "baseline" else cap_s
        return max(cap_s, baseline_s * _FITTED_CAP_FACTOR * factor + compile_s)

    def _baseline_wall_s(self) -> float | None:
        """Wall seconds of this study's baseline trial that ran to its result (None before it has)."""
        records = trial_records(self.study.get_trials(deepcopy=False))
        return next((r.wall_time_s for r in records if r.slot == "baseline" and r.status == "ok" and r.wall_time_s), None)

    def _within_budget(self, cap_s: float) -> tuple[float, bool]:
        """(`cap_s` within the budget left, whether the budget cut it short)."""
        remaining = self.deadline - time.monotonic()
        return max(1.0, min(cap_s, remaining)), remaining < cap_s

    def _run_single(self, assignment, log: Path | None) -> tuple[TrialResult, bool]:
        """(result, cut by the budget) of one trial process."""
        spec, timeout_s, cut_by_budget = self._trial_spec(assignment)
        result = run_trial(spec, self.host, timeout_s=timeout_s, log_path=log, echo=self._echo())
        return result, cut_by_budget

    def _echo(self):
        return sys.stderr if self.options.show_output else None

    def _stored(self, number: int, assignment, result, cut_by_budget: bool, log: Path | None):
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
                error += f"; then start a new study: {self._restart_command()}"
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

    def _run_pair(self, number: int, assignment, log: Path | None):
        """A paired comparison: the candidate (`assignment.config`, arm B) and `assignment.reference` (arm A) in
        alternation (`torchpace.trial.pair`); the candidate's record, with the comparison under `pair`. In
        script mode each arm's output is kept: the candidate's in the trial's log, the reference's beside it."""
        spec, timeout_s, cut_by_budget = self._trial_spec(assignment)
        reference = replace(spec, config=dict(assignment.reference), guard_steps=0, profile=False)
        candidate = replace(spec, profile=False)
        logs = (log.with_name(f"{log.stem}-reference.log"), log) if log is not None else (None, None)
        # a candidate's comparison stops once its CI is clear of the gain it must show to be kept (or clearly
        # under it); the A/A and the final comparison estimate a figure, and run to the CI target or the time.
        # The trial time holds the warm-ups and the rounds, as a single trial's holds its warm-up and windows.
        if self._kept_arms is not None and not assignment.reference:  # the final comparison measures the defaults again
            self._kept_arms.hold(reference)
        if self._kept_arms is not None and assignment.kind == "final":  # and the tuned config in a fresh process
            self._kept_arms.end_serving(candidate)
        options = self._pair_options(assignment, spec.max_time_s)

        def separate_runs_cap_s() -> float:  # each run capped as a trial of its share of the time would be
            nonlocal cut_by_budget  # whether the budget cut the cap the comparison ended under
            cap_s, cut_by_budget = self._within_budget(options.separate_runs_timeout_s)
            return cap_s

        sequential = self._hold_both_reason(reference, candidate)
        if sequential:
            timeout_s = separate_runs_cap_s()
        pair = run_pair(reference, candidate, self.host, timeout_s, options, sequential=sequential,
                        figure=lambda bench: objective_value(bench, self.options.objective)[0],
                        on_round=lambda rounds, summary: self.on_event("round", number=number, rounds=rounds,
                                                                       summary=summary),
                        logs=logs, echo=self._echo(), kept_arms=self._kept_arms, fallback_timeout_s=separate_runs_cap_s)
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

    def _pair_options(self, assignment, max_time_s: float) -> PairOptions:
        """How `assignment`'s comparison runs: its rounds take `max_time_s` with the warm-ups; a candidate's stop
        once their CI is clear of the gain it must show (see `_run_pair`); a separate run has the cap of a
        trial of its share of the time."""
        rounds_s = max_time_s
        if (step_s := self._script_step_s()) is not None:  # a script that ends: its end, not a share of it, ends them
            rounds_s = rounds_for_steps_s(self.fitted_steps, step_s, max_time_s,
                                          self.options.trial_time_s * (assignment.time_factor or 1))
        options = PairOptions(rounds_s=rounds_s, decide_at=1 + ACCEPT_FLOOR if assignment.kind == "candidate" else None,
                              warmups_count=True)
        return replace(options, run_timeout_s=self._cap_s(assignment, options.run_time_s(max_time_s)))

    def _hold_both_reason(self, reference, candidate) -> str | None:
        """Why the two arms cannot be held at once (`torchpace.trial.pair.hold_both_reason`), judged by the
        baseline's peak memory times the arms to start (an arm kept from before holds its memory already)
        against the memory free now on its device; None when they can."""
        records = trial_records(self.study.get_trials(deepcopy=False))
        baseline = next((r.bench for r in records if r.slot == "baseline" and r.status == "ok" and r.bench), None)
        peak = baseline.peak_memory_bytes if baseline else None
        kind = baseline.peak_memory_kind if baseline else ""
        return hold_both_reason(reference, candidate, self._kept_arms, peak, lambda: _free_memory_bytes(kind or ""))

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

    def _restart_command(self) -> str:
        """The command that starts this tune again as a new study (a study without a baseline cannot go on)."""
        return shlex.join(["torchpace", "tune", "--study", f"{self.study_name}-2", "--", *self.options.command])

    def _inference_spec(self) -> dict[str, Any]:
        """TrialSpec fields for the objective and, for inference workloads, the accuracy guard (they have no loss curve)."""
        if not self.is_inference:
            return {"objective": self.options.objective}
        o = self.options
        return {"objective": o.objective, "accuracy_batches": o.accuracy_batches,
                "accuracy_rtol": o.accuracy_rtol, "accuracy_atol": o.accuracy_atol, "min_top1_agreement": o.min_top1_agreement}

    # ---- the outcome ----------------------------------------------------------------------------
    def _finish(self, stopped: str) -> TuneOutcome:
        state = self.sampler.plan(self.study) if self.options.strategy == "greedy" else None
        outcome = build_outcome(trial_rows(self.study, self.options.objective), state, self._study_meta(), stopped)
        _log.info("tune stopped (%s); best config: %s", stopped,
                  "none" if outcome.best is None else dict(outcome.best_config) or "the defaults")
        if outcome.best is not None:
            if self._save(outcome):
                outcome = replace(outcome, out_path=str(self.options.out))
            if self.options.export_path is not None and stopped != "interrupted":
                outcome = replace(outcome, export=self._export(outcome.best_config))
        return outcome

    def _study_meta(self) -> StudyMeta:
        o = self.options
        accuracy = (o.accuracy_batches, o.accuracy_rtol, o.min_top1_agreement) if self.is_inference else None
        return StudyMeta(self.study_name, redact_url(self.storage_url), o.strategy, self.spec, o.objective,
                         build_guard_note(o.guard_steps, accuracy), command=tuple(o.command) or None)

    def _export(self, config: dict[str, Any]):
        """Write the chosen model to --export (what was written, or why no format works)."""
        from torchpace.tune.export import ExportFailed, export_workload

        self.on_event("exporting")
        try:
            info = export_workload(load_workload(self.spec), dict(config), self.options.export_path, host=self.host)
            return ExportOutcome.from_dict(info.to_dict())
        except (ExportFailed, OutputWriteFailed) as err:
            return ExportOutcome(path=str(self.options.export_path), error=str(err))

    def _save(self, outcome: TuneOutcome) -> bool:
        """Write --out; False when it could not be written (`write_failure`, raised once the outcome is reported)."""
        script = {"command": list(self.options.command)} if self.options.command else {}
        result = {"workload": self.spec, **script, "study": self.study_name, "storage": redact_url(self.storage_url),
                  **result_table(outcome), **_inference_result(outcome)}
        try:
            save_config(RunConfig(dict(outcome.best_config), self.host.summary(), result), self.options.out)
        except OutputWriteFailed as failure:  # a full disk: the outcome is still reported, then this error
            self.write_failure = failure
            return False
        _log.info("wrote %s", self.options.out)
        return True


def _compile_allowance_s(assignment) -> float:
    """The compile allowance of `assignment`'s trials (both arms of a comparison: the longer one): what its
    specs carry to the script's stall watchdog and what its caps add."""
    return compile_allowance_s({**(assignment.reference or {}), **assignment.config})


def _free_memory_bytes(kind: str) -> int | None:
    """Memory free now where a trial's peak was measured: the current CUDA device for a `cuda*` peak, else
    the host's available memory (None when unreadable)."""
    if kind.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None

    return psutil.virtual_memory().available


def _inference_result(outcome: TuneOutcome) -> dict[str, Any]:
    """Figures of an inference tune saved in torchpace.toml's [result]: the objective, batch-1 latency."""
    base = outcome.baseline.latency if outcome.baseline else None
    if outcome.objective == "throughput" and base is None:
        return {}
    best = outcome.best.latency if outcome.best else None
    return {"objective": outcome.objective, "baseline_latency_p50_s": base.p50_s if base else None,
            "tuned_latency_p50_s": best.p50_s if best else None}
