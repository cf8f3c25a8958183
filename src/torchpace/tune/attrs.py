"""What torchpace stores on an Optuna trial, as records: the one module that reads and writes a
trial's attributes by name.

A trial carries torchpace's data under one key (`ATTR`) in two places. Its *system* attributes hold
its `Assignment` (the slot the greedy policy pinned, the config, the config it is compared with, the
tuner running it); its *user* attributes hold the assignment again and what the trial gave (status,
bench figures, the guard's losses, a comparison's `PairRecord`). `TrialRecord.from_trial` reads both
into one record; `TrialRecord.result_attrs` is what the tuner stores when a trial ends.

Every study written so far reads: trials from before steps/s or `objective_value`, and comparisons
whose reference arm was stored in part (`BenchResult.from_dict(partial=True)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from torchpace.errors import whole_number_in
from torchpace.host import host_summary_problem
from torchpace.measure.result import AccuracyReport, BenchResult, Objective
from torchpace.records import from_json, to_json
from torchpace.trial.schedule import SEQUENTIAL, TURNS_PER_ROUND

ATTR = "torchpace"
STUDY_KIND = "torchpace.study"
STUDY_SCHEMA_VERSION = 1
_RUNNING, _COMPLETE = "RUNNING", "COMPLETE"  # Optuna's TrialState names
# a study's user attribute: the trial time sized to a script that ended before a trial could measure it
# (set when its baseline ran; every later trial, also after --resume, measures for that long)
FITTED_TRIAL_TIME_ATTR = "torchpace.trial_time_s"
# with it (studies since): the steps such a script makes after its first one; each trial then measures for the
# share of the time those steps take at the step time the study's latest trials ran (`trial.script.sized_to_steps_s`)
FITTED_TRIAL_STEPS_ATTR = "torchpace.trial_steps"


@dataclass(frozen=True)
class StudyAttrs:
    """A torchpace study's metadata (the study's user attribute `ATTR`).

    Attributes:
        workload: the workload spec (script mode: the command as one string).
        host_fingerprint: the fingerprint of the host it was tuned on (`host` its summary).
        strategy: greedy, tpe, random or grid.
        paired: greedy decides by paired comparisons (False for studies tuned before they came).
        greedy_revision: the revision of the paired greedy policy it was tuned with
            (`torchpace.tune.policy.GREEDY_REVISION`; 1 for studies from before revisions were recorded):
            a study is replayed, resumed and reported with its own.
        objective: `throughput` or `latency`.
        command: script mode: the command (None for a Workload).
        torchpace_version: the torchpace that created the study (None for studies from before it was recorded).
        defaults: knob name -> the default the search started from, where the workload gave its own
            (`Workload.loader_options`, e.g. `data.num_workers` 4); a knob not named has its registry
            default. The report replays the search from these.
    """

    kind: str = STUDY_KIND
    schema_version: int | None = STUDY_SCHEMA_VERSION
    workload: str | None = None
    host_fingerprint: str | None = None
    host: Mapping[str, Any] = field(default_factory=dict)
    strategy: str = "greedy"
    paired: bool = False
    greedy_revision: int = 1
    objective: str = "throughput"
    command: tuple[str, ...] | None = None
    torchpace_version: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def to_attrs(self) -> dict[str, Any]:
        return to_json(self)

    def problem(self) -> str | None:
        """What in this metadata torchpace never writes, naming the field, what it holds and what it should
        (a study changed or damaged outside torchpace); None when every field is as torchpace writes it."""
        def words(v):
            return isinstance(v, (list, tuple)) and all(isinstance(w, str) for w in v)

        checks = (("workload", "a string", lambda v: v is None or isinstance(v, str)),
                  ("host_fingerprint", "a string", lambda v: v is None or isinstance(v, str)),
                  ("strategy", "a strategy's name", lambda v: isinstance(v, str)),
                  ("paired", "true or false", lambda v: isinstance(v, bool)),
                  ("greedy_revision", "a whole number >= 1", lambda v: whole_number_in(v, 1)),
                  ("objective", "throughput or latency", lambda v: v in ("throughput", "latency")),
                  ("command", "a list of the command's words", lambda v: v is None or words(v)),
                  ("torchpace_version", "a version string", lambda v: v is None or isinstance(v, str)),
                  ("defaults", "a table of knob names and values", lambda v: isinstance(v, Mapping)))
        for name, expected, ok in checks:
            if not ok(getattr(self, name)):
                return f"{name}: expected {expected}, found {getattr(self, name)!r}"[:200]
        return host_summary_problem(self.host)

    @classmethod
    def from_attrs(cls, attrs: Any) -> "StudyAttrs | None":
        """The metadata in `attrs` (None when it is not a torchpace study's)."""
        if not isinstance(attrs, Mapping) or attrs.get("kind") != STUDY_KIND:
            return None
        return from_json(cls, attrs)

    @classmethod
    def of(cls, study: Any) -> "StudyAttrs | None":
        """The metadata of an Optuna study or study summary (None for another application's study)."""
        return cls.from_attrs(study.user_attrs.get(ATTR))


@dataclass(frozen=True)
class Assignment:
    """What a trial is to run, pinned on it before it runs (its system attributes).

    Attributes:
        action: the greedy sampler's word: `run`, `wait` (every pending trial is running elsewhere) or
            `done` (nothing is left); None for the other strategies.
        slot: which planned trial this is (`baseline`, `pair:KNOB=VALUE`, ...; `trial:N` for other strategies).
        kind: `baseline`, `noise`, `candidate`, `remeasure` or `final`.
        config: knob values that differ from the defaults.
        reference: a comparison's other arm (its config), None for a trial measured alone.
        time_factor: its trial time as a multiple of the tune's `--trial-time` (None: 1).
        lock_wait_s: how long the sampler waited for the study's assignment lock.
        worker: the tuner running it (host:pid).
        process: that tuner's process as `fail_stale_trials` recognises it.
    """

    action: str | None = None
    slot: str | None = None
    kind: str | None = None
    stage: str | None = None
    knob: str | None = None
    value: Any = None
    config: Mapping[str, Any] = field(default_factory=dict)
    reference: Mapping[str, Any] | None = None
    time_factor: float | None = None
    lock_wait_s: float | None = None
    worker: str | None = None
    process: str | None = None

    def to_attrs(self) -> dict[str, Any]:
        """The system attribute `ATTR` of a trial assigned this."""
        return {name: value for name, value in to_json(self).items() if value is not None or name == "reference"}


@dataclass(frozen=True)
class PairRecord:
    """A paired comparison, stored on its candidate's trial (arm B; arm A is the assignment's `reference`).

    Attributes:
        mode: `alternating` or `sequential` (separate runs).
        ratios: each round's B / A.
        ratio: the median of `ratios`, with its 95% CI (`ratio_ci_low`, `ratio_ci_high`) and `rounds`.
        other_load_a: cores other processes used during arm A's turns (`other_load_b`: B's).
        reference_value: the reference arm's figure as the tuner ranks it (higher is better).
        reference_bench: the reference arm's bench (its figures only, without losses and host).
        reused: the arms (`a`, `b`) whose process an earlier comparison of this tuner had started and kept
            (`torchpace.trial.arms.KeptArms`): no process was started for them (empty in studies tuned before).
    """

    mode: str | None = None
    mode_reason: str | None = None
    stopped_by: str | None = None
    ratios: tuple[float, ...] = ()
    ratio: float | None = None
    ratio_ci_low: float | None = None
    ratio_ci_high: float | None = None
    ratio_ci_coverage: float | None = None
    rounds: int = 0
    other_load_a: float | None = None
    other_load_b: float | None = None
    usable_cores: int | None = None
    wall_time_s: float | None = None
    reference_status: str | None = None
    reference_error: str = ""
    reference_value: float | None = None
    reference_bench: BenchResult | None = None
    reused: tuple[str, ...] = ()

    @property
    def processes_started(self) -> int:
        """Trial processes this comparison started: two, less its reused arms; separate runs one per run,
        `TURNS_PER_ROUND` to a round (a comparison of separate runs tuned before rounds took three ran one
        fewer: A B A B A for 2 rounds)."""
        if self.mode == SEQUENTIAL:
            return TURNS_PER_ROUND * len(self.ratios)
        return 2 - len(self.reused)

    @property
    def other_load_cores(self) -> float | None:
        """The most cores other processes used during either arm's turns (None: unread)."""
        loads = [v for v in (self.other_load_a, self.other_load_b) if v is not None]
        return max(loads) if loads else None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> "PairRecord":
        bench = attrs.get("reference_bench")
        record = from_json(cls, {**attrs, "reference_bench": None})
        return replace(record, reference_bench=_stored_bench(bench, partial=True)) if bench else record


@dataclass(frozen=True)
class TrialRecord:
    """One torchpace trial as stored on an Optuna trial.

    Attributes:
        number: Optuna's trial number.
        state: Optuna's trial state (`COMPLETE`, `RUNNING`, `FAIL`, ...).
        started: when it started (None while waiting).
        assignment: what it was to run.
        status: how it ended (`ok` or a failure class; `budget`, `interrupted`, `partner` for trials with
            no verdict); None when nothing was stored.
        bench: its measurement, without loss values and host (None unless it measured).
        usable_cores: the cores its host gave torchpace.
        guard_losses: the losses of its seeded guard steps.
        guard_metric: the workload's `evaluate()` after the guard steps.
        verdict: its profile's bottleneck verdict (the baseline's).
        accuracy: inference: its outputs against the fp32 eager reference.
        objective_value: the figure the tuner ranked it by, higher is better (samples/s or steps/s, or
            1 / p50 under `--objective latency`), with its relative CI `objective_ci_rel`; trials stored
            before it was (studies tuned before `--objective`) were ranked by their samples/s.
        pair: the comparison, for a trial compared with another config.
        output_log: script mode: the log file that holds the trial's script output.
    """

    number: int
    state: str
    started: datetime | None = None
    assignment: Assignment = field(default_factory=Assignment)
    status: str | None = None
    bench: BenchResult | None = None
    usable_cores: int | None = None
    guard_losses: tuple[float, ...] = ()
    guard_metric: float | None = None
    verdict: str | None = None
    error: str = ""
    stderr_tail: str = ""
    wall_time_s: float | None = None
    accuracy: AccuracyReport | None = None
    objective_value: float | None = None
    objective_ci_rel: float | None = None
    pair: PairRecord | None = None
    output_log: str | None = None

    @property
    def slot(self) -> str | None:
        return self.assignment.slot

    @property
    def running(self) -> bool:
        return self.state == _RUNNING

    @property
    def complete(self) -> bool:
        return self.state == _COMPLETE

    def figure(self, objective: str) -> Objective | None:
        """Its figure under objective `objective` (`throughput` or `latency`), None without a measurement."""
        return self.bench.objective_for(objective) if self.bench is not None else None

    def ranked_figure(self) -> tuple[float | None, float | None]:
        """(figure, relative CI) the tuner ranked this trial by (see `objective_value`)."""
        if self.objective_value is not None or self.bench is None:
            return self.objective_value, self.objective_ci_rel
        return self.bench.objective.score, self.bench.objective.ci_rel_halfwidth

    def measured(self, objective: str) -> "TrialRecord":
        """This record with its ranked figure taken from its bench under `objective` (the tuner's, once it ended)."""
        figure = self.figure(objective)
        if figure is None or figure.score is None:
            return replace(self, objective_value=None, objective_ci_rel=None)
        return replace(self, objective_value=figure.score, objective_ci_rel=figure.ci_rel_halfwidth)

    @classmethod
    def from_trial(cls, trial: Any) -> "TrialRecord":
        """The record of an Optuna `FrozenTrial` (empty `assignment` for trials torchpace did not annotate)."""
        return cls.from_attrs(trial.system_attrs.get(ATTR) or {}, trial.user_attrs.get(ATTR) or {}, trial.number,
                              trial.state.name, trial.datetime_start)

    @classmethod
    def from_attrs(cls, system: Mapping[str, Any], user: Mapping[str, Any], number: int, state: str,
                   started: datetime | None = None) -> "TrialRecord":
        """The record of a trial's two `ATTR` attributes (the user attributes win where both hold a name)."""
        attrs = {**system, **user}
        bench = attrs.get("bench")
        return cls(
            number=number, state=state, started=started, assignment=from_json(Assignment, attrs),
            status=attrs.get("status"), bench=_stored_bench(bench), usable_cores=(bench or {}).get("usable_cores"),
            guard_losses=tuple(attrs.get("guard_losses") or ()), guard_metric=attrs.get("guard_metric"),
            verdict=attrs.get("verdict"), error=attrs.get("error") or "", stderr_tail=attrs.get("stderr_tail") or "",
            wall_time_s=attrs.get("wall_time_s"),
            accuracy=AccuracyReport.from_dict(attrs["accuracy"]) if attrs.get("accuracy") else None,
            objective_value=attrs.get("objective_value"), objective_ci_rel=attrs.get("objective_ci_rel"),
            pair=PairRecord.from_attrs(attrs["pair"]) if attrs.get("pair") else None, output_log=attrs.get("output_log"))

    def result_attrs(self) -> dict[str, Any]:
        """The user attribute `ATTR` of this trial once it ended: its assignment and what it gave."""
        bench = None
        if self.bench is not None:
            bench = {**{k: v for k, v in self.bench.to_dict().items() if k not in ("loss_values", "host")},
                     "usable_cores": self.usable_cores}
        attrs = {**self.assignment.to_attrs(), "status": self.status, "bench": bench,
                 "guard_losses": list(self.guard_losses), "guard_metric": self.guard_metric, "verdict": self.verdict,
                 "error": self.error, "stderr_tail": self.stderr_tail, "wall_time_s": self.wall_time_s,
                 "accuracy": self.accuracy.to_dict() if self.accuracy is not None else None,
                 "objective_value": self.objective_value, "objective_ci_rel": self.objective_ci_rel}
        if self.pair is not None:
            attrs["pair"] = self.pair.to_dict()
        if self.output_log is not None:
            attrs["output_log"] = self.output_log
        return attrs


def stored_bench(bench: BenchResult) -> BenchResult:
    """A bench as a trial stores it: its figures, without the loss of every step and the host."""
    return replace(bench, loss_values=(), host={})


def _stored_bench(data: Mapping[str, Any] | None, partial: bool = False) -> BenchResult | None:
    if not data:
        return None
    return BenchResult.from_dict({k: v for k, v in data.items() if k != "usable_cores"}, partial=partial)


def interrupted_attrs() -> dict[str, Any]:
    """The user attribute `ATTR` of a trial the tuner was stopped during (`--resume` runs it again)."""
    return {"status": "interrupted",
            "error": "the tuner was stopped (Ctrl-C or SIGTERM) during this trial; `--resume` runs it again"}

