"""`Tuner`: the study loop. Its strategy (`tune.strategy`: greedy by default) says what each trial runs,
the trial executor (`tune.executor`) runs it, in its own process or as a paired comparison, within the
budget, and the record is stored on the Optuna trial. At the end, or when the budget runs out or the
user presses Ctrl-C, the best config so far is written.
"""

from __future__ import annotations

import itertools
import logging
import os
import shlex
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from torchpace.config import RunConfig, save_config
from torchpace.errors import UsageError
from torchpace.files import OutputWriteFailed, own_folder
from torchpace.knobs import REGISTRY
from torchpace.launch.command import parse_python_command
from torchpace.protocol import check_eval_batches
from torchpace.redact import redact_url
from torchpace.script.knobs import script_target
from torchpace.trial.output import trial_log_path
from torchpace.tune.attrs import ATTR, TrialRecord, interrupted_attrs
from torchpace.tune.executor import Budget, TrialExecutor, restart_command
from torchpace.tune.figures import result_table
from torchpace.tune.guard import check_guard_steps
from torchpace.tune.handle import StudyHandle
from torchpace.tune.objective import check_objective
from torchpace.tune.options import TuneOptions
from torchpace.tune.outcome import ExportOutcome, StudyMeta, TuneOutcome, build_guard_note, build_outcome, trial_rows
from torchpace.tune.space import KnobSpace, build_space
from torchpace.tune.storage import StorageFailed, check_storage, default_storage_url, open_storage, storage_failures
from torchpace.tune.strategy import check_strategy, make_strategy
from torchpace.tune.study import fail_stale_trials, open_study, stored_study, study_metadata, trial_records, tuner_process
from torchpace.workload import DEFAULT_WORKLOAD, load_workload

__all__ = ["TuneOptions", "Tuner", "make_conflicts"]

_log = logging.getLogger(__name__)

_NOT_A_VERDICT = ("ok", "budget", "interrupted")  # trial statuses that leave a baseline usable or to be run again


def _worker_id() -> str:
    """host:pid of this tuner process, stored on each trial (several tuners may share a study)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _TrialFailed(Exception):
    """A trial ended with a failure class (a result, not an error of the tuner)."""


def make_conflicts(space: list[KnobSpace]) -> Callable[[dict], str | None]:
    """A function: config -> why the tuner must not run it (a knob conflict, e.g. prefetch without
    workers, or a config that cannot gain, e.g. DDP in one process), or None. Where the config does not set
    a knob, its value is the space's default: a workload's own (its loader's workers)."""
    own_defaults = {k.name: k.default for k in space}

    def conflicts(config: dict) -> str | None:
        values = RunConfig(config).with_defaults(own_defaults).full_values()
        for knob_space in space:
            knob = REGISTRY[knob_space.name]
            reason = knob.conflicts(values) or knob.pointless(values)
            if reason:
                return reason
        return None

    return conflicts


class Tuner:
    """Runs one tune session against a study (several sessions may share the study).

    Attributes:
        strategy: what each trial runs (`tune.strategy.Strategy`).
        executor: runs it (`tune.executor.TrialExecutor`).
        budget: the tune's time (`tune.executor.Budget`).
    """

    def __init__(self, options: TuneOptions, host, on_event: Callable[..., None] | None = None):
        # lazy: optuna (hundreds of ms) loads only when a study is opened
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)  # torchpace renders its own progress
        check_strategy(options.strategy)
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
        self.is_inference = not workload.is_training
        check_objective(options.objective, workload.is_training, self.spec)
        if options.export_path is not None and (workload.is_training or options.command):
            raise UsageError(f"--export writes an optimized inference model, and {self.spec!r} trains (its Workload has "
                             "a loss); export applies to inference workloads (loss=None), e.g. the built-in `inference`")
        self.space = build_space(host, workload, only=options.knobs, objective=options.objective,
                                 script=bool(options.command))
        self.conflicts = make_conflicts(self.space)
        suffix = "-latency" if options.objective == "latency" else ""
        self.study_name = options.study or f"torchpace-{workload.name}{suffix}"
        if options.command:  # the trials' log folder, before the study exists: one that cannot be made is refused first
            own_folder(trial_log_path(self.study_name, 0).parent)
        self.budget = Budget(options.budget_s)
        with storage_failures(self.storage_url):
            self._open()
        _log.info("study %r: %d trials stored; strategy %s over %s; budget %.0f s", self.study_name,
                  len(self.study.get_trials(deepcopy=False)), options.strategy, [k.name for k in self.space], options.budget_s)

    def _open(self) -> None:
        """Open the study with its strategy (a study tuned before goes on as it was tuned) and its executor."""
        o = self.options
        storage = open_storage(self.storage_url)
        self.handle = StudyHandle(storage, self.study_name)
        command = tuple(o.command) if o.command else None
        meta = study_metadata(self.spec, self.host, o.strategy, o.objective, command,
                              defaults={k.name: k.default for k in self.space if k.default != REGISTRY[k.name].default})
        stored = stored_study(storage, self.study_name, meta, o.resume)
        self.strategy = make_strategy(o.strategy, self.space, self.conflicts, o.seed, self.handle, stored,
                                      self.budget.short_of)
        meta = replace(meta, **self.strategy.study_attrs)
        self.study = open_study(storage, self.study_name, meta, o.resume, self.strategy.sampler)
        self.executor = TrialExecutor(o, self.host, self.spec, self.is_inference, self.study, self.study_name,
                                      self.budget, self.on_event, keep_final_time=self.strategy.keeps_final_time)

    def _target(self):
        """The Workload to tune, or for script mode what the knobs can know of the script before it runs."""
        if not self.options.command:
            return load_workload(self.spec)

        program = parse_python_command(self.options.command)
        return script_target(program.name, program)

    # ---- the loop -------------------------------------------------------------------------------
    def run(self) -> TuneOutcome:
        """Run trials until the strategy is done, the budget or trial cap is reached, or Ctrl-C."""
        stopped = "done"
        try:
            with storage_failures(self.storage_url):
                fail_stale_trials(self.study, self.handle)  # a tuner killed before this --resume: its trial runs again
                self._say_where_output_goes()
                self._say_how_to_restart()
                self.strategy.begin(self.study)
                if not self.strategy.done(self._trials()):
                    with self.executor.arms_kept():
                        self.study.optimize(self._objective, n_trials=self.options.max_trials,
                                            timeout=self.options.budget_s, catch=(_TrialFailed,), callbacks=[self._after_trial])
                    stopped = self._why_stopped()
        except KeyboardInterrupt:
            stopped = "interrupted"
            raise
        except StorageFailed:
            stopped = "storage failed"
            raise
        finally:
            self.outcome = self._finish_after(stopped)
        return self.outcome

    def _trials(self) -> list:
        return self.study.get_trials(deepcopy=False)

    def _why_stopped(self) -> str:
        """Why the loop ended: `done`, `budget` (also when time was kept for the final comparison instead of
        every knob, which a notice names) or `max-trials`."""
        trials = self._trials()
        done = self.strategy.done(trials)
        stopped = "done" if done else "budget" if self.budget.spent else "max-trials" if self.options.max_trials else "done"
        state = self.strategy.replay(trials)
        if state is not None and state.left_undecided:  # time was kept for the final comparison, not every knob
            final = ("held one more comparison, so the config kept so far was compared with the defaults"
                     if done else "ran out before the config kept so far was compared with the defaults")
            self.on_event("notice", message=(f"the budget left {final}; not decided: {', '.join(state.left_undecided)} "
                                             "(`--resume` with a larger --budget decides them)"))
            return "budget"
        return stopped

    def _after_trial(self, study, trial) -> None:
        # Optuna's own timeout counts from `optimize`, after this tuner's set-up: past the budget, every
        # trial it would still start is cut at once (a stored `budget` trial each, seen 14 in a row)
        if self.budget.spent or self.strategy.done(self._trials()):
            study.stop()

    def _objective(self, trial) -> float:
        # lazy: optuna (hundreds of ms) loads only when a study is opened
        import optuna

        assignment = self.strategy.assignment(self.study, trial.number, self.budget.deadline,
                                              on_wait=lambda: self.on_event("waiting"))
        if assignment.action == "done":
            self.study.stop()
            raise optuna.TrialPruned("the search is complete")
        suggested = {k.name: trial.suggest_categorical(k.name, list(k.values)) for k in self.space}
        assignment = replace(assignment, slot=assignment.slot or f"trial:{trial.number}",
                             kind=assignment.kind or "candidate", config=self.strategy.config(assignment, suggested),
                             worker=_worker_id(), process=tuner_process())
        self.handle.pin(trial.number, assignment.to_attrs())
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

    def _run_one(self, number: int, assignment) -> TrialRecord:
        """The record of trial `number`: run by the executor, unless its config conflicts (`invalid`, not run),
        judged on what would run: an unmodified script's own settings (its baseline's) under the config's."""
        reason = self.conflicts({**self._script_settings(), **assignment.config})
        if reason:
            _log.info("trial %d (%s) not run: %s", number, assignment.slot, reason)
            return TrialRecord(number, "RUNNING", assignment=assignment, status="invalid", error=reason)
        return self.executor.run(number, assignment)

    def _script_settings(self) -> dict:
        """An unmodified script's own values of the knobs that reach it (what its DataLoader and optimizer were
        given), as its baseline read them; {} before the baseline ran, and for a workload."""
        records = trial_records(self.study.get_trials(deepcopy=False))
        bench = next((r.bench for r in records if r.slot == "baseline" and r.status == "ok" and r.bench), None)
        return dict(bench.script.script_settings or {}) if bench is not None and bench.script is not None else {}

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
        restart = restart_command(self.study_name, self.options.command) if self.options.command else (
            shlex.join(["torchpace", "tune", "--study", f"{self.study_name}-2", self.spec]))  # a name may hold spaces
        self.on_event("notice", message=f"study {self.study_name!r} cannot go on: its baseline failed "
                                        f"({why.splitlines()[-1]}); after changing what failed, start a new "
                                        f"study: {restart}")

    # ---- the outcome ----------------------------------------------------------------------------
    def _finish(self, stopped: str) -> TuneOutcome:
        state = self.strategy.replay(self._trials())
        rows = trial_rows(self.study, self.options.objective, self.strategy.guard_scatter)
        outcome = build_outcome(rows, state, self._study_meta(), stopped)
        _log.info("tune stopped (%s); best config: %s", stopped,
                  "none" if outcome.best is None else dict(outcome.best_config) or "the defaults")
        if outcome.best is not None:
            if stopped not in ("interrupted", "storage failed"):
                outcome = self._run_on(outcome)
            if self._save(outcome):
                outcome = replace(outcome, out_path=str(self.options.out))
            if self.options.export_path is not None and stopped != "interrupted":
                outcome = replace(outcome, export=self._export(outcome.best_config))
        return outcome

    def _run_on(self, outcome: TuneOutcome) -> TuneOutcome:
        """Script mode: run the kept config past its measured steps (`torchpace.trial.runon`) before it is written;
        a knob found breaking the script there is taken back from what is written."""
        o = self.options
        if not o.command or o.run_on_s <= 0 or not outcome.best_config:
            return outcome
        # lazy: only a script study whose config is to be written runs the script on
        from torchpace.trial.runon import find_culprit, run_on

        self.on_event("run_on", limit_s=o.run_on_s)
        folder = trial_log_path(self.study_name, 0).parent
        runs = itertools.count(1)  # the config's run, then the defaults', then one per knob taken back

        def run(config):
            log = folder / f"run-on-{next(runs)}.log"
            return run_on(o.command, config, self.host, os.environ, o.run_on_s, log)

        check = find_culprit(dict(outcome.best_config), run)
        _log.info("run-on check: %s", check.describe())
        self.on_event("notice", message=f"run-on check of the tuned config: {check.describe()} "
                                        f"(its output: {folder}/run-on-1.log)")
        return replace(outcome, run_on=check)

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
            save_config(RunConfig(dict(outcome.written_config), self.host.summary(), result), self.options.out)
        except OutputWriteFailed as failure:  # a full disk: the outcome is still reported, then this error
            self.write_failure = failure
            return False
        _log.info("wrote %s", self.options.out)
        return True


def _inference_result(outcome: TuneOutcome) -> dict[str, Any]:
    """Figures of an inference tune saved in torchpace.toml's [result]: the objective, batch-1 latency."""
    base = outcome.baseline.latency if outcome.baseline else None
    if outcome.objective == "throughput" and base is None:
        return {}
    best = outcome.best.latency if outcome.best else None
    return {"objective": outcome.objective, "baseline_latency_p50_s": base.p50_s if base else None,
            "tuned_latency_p50_s": best.p50_s if best else None}
