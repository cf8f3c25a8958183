"""The study on Optuna: torchpace metadata checks, and trial records for the policy.

Where the study lives (a SQLite file `.torchpace/studies.db` by default, or a PostgreSQL server several
identical hosts share) is `torchpace.tune.storage`. The trials of a killed tuner are failed
(`fail_stale_trials`: at once when it ran on this host, after the heartbeat grace when it ran on another),
so `--resume` (or another tuner on the study) re-runs them and loses no finished trial.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from torchpace._version import __version__
from torchpace.errors import UsageError
from torchpace.redact import redact_words
from torchpace.tune.attrs import (ATTR, STUDY_KIND, STUDY_SCHEMA_VERSION, PairRecord, StudyAttrs,  # noqa: F401
                                  TrialRecord)
from torchpace.tune.guard import check_trial_guard, guard_cannot_judge
from torchpace.tune.policy import COMPLETE, GREEDY_REVISION, RETRY, RUNNING, Record
from torchpace.tune.storage import default_storage_url, open_storage  # noqa: F401  (where callers found them)

_log = logging.getLogger(__name__)
# a study's name is shown in tables and messages and typed again with --resume: longer is a slip (a path or a
# command pasted); Optuna itself stores up to 512 characters
MAX_STUDY_NAME = 200


def check_study_name(name: str) -> str:
    """`name` when it can name a study, else UsageError (exit 2) saying why: a name is at most `MAX_STUDY_NAME`
    printable characters (no control or invisible character: it is shown in a terminal and names a log
    folder), not only spaces, and not `.` or `..` (which name folders)."""
    shown = repr(name if len(name) <= 60 else name[:60] + "...")
    if not name.strip():
        problem = "is empty"
    elif len(name) > MAX_STUDY_NAME:
        problem = f"is {len(name)} characters long"
    elif not name.isprintable():
        problem = f"holds a control or invisible character ({next(c for c in name if not c.isprintable())!r})"
    elif name in (".", ".."):
        problem = f"is {name!r}, which names a folder"
    else:
        return name
    raise UsageError(f"--study {shown} {problem}; a study name is at most {MAX_STUDY_NAME} printable characters, not "
                     "empty, and not '.' or '..' (e.g. --study resnet-bf16)")


def study_metadata(workload: str, host, strategy: str, objective: str = "throughput",
                   command: tuple[str, ...] | None = None, defaults: Mapping[str, Any] | None = None,
                   **strategy_attrs: Any) -> StudyAttrs:
    """A new study's metadata, with what its strategy records of itself (`Strategy.study_attrs`: greedy's
    `paired` and `greedy_revision`, with which a study tuned before either is resumed and reported);
    `defaults`: the workload's own knob defaults (`StudyAttrs.defaults`); the torchpace that made it."""
    if command is not None:  # a study may live in a shared database: no secret of the command is stored
        command = redact_words(command)
        workload = shlex.join(command)
    return StudyAttrs(workload=workload, host_fingerprint=host.fingerprint(), host=host.summary(), strategy=strategy,
                      objective=objective, command=command, defaults=dict(defaults or {}),
                      torchpace_version=__version__, **strategy_attrs)


def check_stored_study(name: str, meta: StudyAttrs) -> None:
    """UsageError (exit 2) when this torchpace cannot read a torchpace study as it was tuned: one written with
    another study schema, or with a newer revision of the greedy policy than this torchpace knows (a newer
    torchpace tuned it: resumed or reported here, it would be replayed under an older policy), or one whose
    stored metadata is not what torchpace writes (`StudyAttrs.problem`: a host record that is not one, a
    revision that is not a number). Both versions are named."""
    made_by = f"torchpace {meta.torchpace_version}" if isinstance(meta.torchpace_version, str) else "another torchpace"
    if meta.schema_version != STUDY_SCHEMA_VERSION:
        raise UsageError(f"study {name!r} was written by {made_by} with torchpace study schema {meta.schema_version!r}, "
                         f"and this torchpace {__version__} reads schema {STUDY_SCHEMA_VERSION}: open it with the "
                         "torchpace that wrote it, or start a new --study")
    problem = meta.problem()
    if problem:
        raise UsageError(f"study {name!r} holds metadata torchpace did not write ({problem}): it was changed or damaged "
                         "outside torchpace; start a new --study (its trials are in the storage as they were)")
    if meta.greedy_revision > GREEDY_REVISION:
        raise UsageError(f"study {name!r} was tuned by {made_by} with revision {meta.greedy_revision} of the greedy "
                         f"policy, and this torchpace {__version__} knows revisions up to {GREEDY_REVISION}: here it would "
                         "be resumed and reported under an older policy; upgrade torchpace (pip install -U torchpace) "
                         "to go on with it, or start a new --study")


def check_study_metadata(name: str, meta: StudyAttrs | None, expected: StudyAttrs) -> None:
    """UsageError when an existing study is not torchpace's, cannot be read by this torchpace
    (`check_stored_study`), or was tuned elsewhere or on another workload."""
    if meta is None:
        raise UsageError(f"study {name!r} exists but is not a torchpace study; choose another --study name")
    check_stored_study(name, meta)
    for key, label in (("command", "command"), ("workload", "workload"), ("host_fingerprint", "host fingerprint"),
                       ("strategy", "strategy")):
        if key == "workload" and meta.command is not None and expected.command is not None:
            continue  # a script's study is its command (compared above); its workload is how a version spelled it
        stored = redact_words(meta.command) if key == "command" and meta.command is not None else getattr(meta, key)
        if stored != getattr(expected, key):
            raise UsageError(f"study {name!r} was tuned with {label} {_shown(getattr(meta, key))}, not "
                             f"{_shown(getattr(expected, key))}: its measurements do not transfer; use a new --study name")
    if meta.objective != expected.objective:
        raise UsageError(f"study {name!r} was tuned for --objective {meta.objective}, not {expected.objective}: its "
                         "decisions compare another figure; use a new --study name")


def _shown(value: Any) -> str:
    """A metadata value in a message: a command as a shell runs it (`shlex.join`, in backticks), anything else as repr."""
    return f"`{shlex.join(value)}`" if isinstance(value, (list, tuple)) else repr(value)


def stored_study(storage, name: str, meta: StudyAttrs, resume: bool) -> StudyAttrs | None:
    """The metadata of study `name` in `storage`, checked against `meta` (a new study's), when it exists; None
    when it does not (a new study will be created).

    Raises:
        UsageError: the study is not torchpace's or was tuned elsewhere, or holds trials and `resume` was not
            asked for; or `resume` was asked for and there is no such study.
    """
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    if name in existing:
        stored = StudyAttrs.of(existing[name])
        check_study_metadata(name, stored, meta)
        if not resume and existing[name].n_trials:
            raise UsageError(f"study {name!r} already has {existing[name].n_trials} trials: pass --resume to continue it, "
                             "or --study NEW_NAME to start another")
        return stored
    if resume:
        raise UsageError(f"--resume: no study named {name!r} in this storage (known: {', '.join(existing) or 'none'})")
    return None


def open_study(storage, name: str, meta: StudyAttrs, resume: bool, sampler):
    """Create a new study, or (with `resume`) load and check an existing one (see `stored_study`)."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    if stored_study(storage, name, meta, resume) is not None:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    try:
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="maximize")
    except optuna.exceptions.DuplicatedStudyError:
        raise UsageError(f"another tuner created study {name!r} a moment ago: pass --resume to work on it too") from None
    study.set_user_attr(ATTR, meta.to_attrs())
    return study


@functools.lru_cache(maxsize=1)
def _this_machine() -> str | None:
    """Boot id and pid namespace: where a pid names one process (a host name is not enough: containers on
    one host may share it and not their pids). None where unreadable (not Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def tuner_process() -> str | None:
    """This process as `fail_stale_trials` recognises it: this machine, pid and start time (a pid may be
    reused). None where the machine is unreadable: such a tuner's trials are failed after the heartbeat
    grace only."""
    machine = _this_machine()
    return None if machine is None else f"{machine}/{_process_start(psutil.Process())}"


def _process_start(process) -> str:
    """A psutil process as pid@start time (the start time is read from /proc, the same each time)."""
    return f"{process.pid}@{process.create_time():.2f}"


def fail_stale_trials(study, handle) -> None:
    """Fail the running trials of `study` (through its `handle.StudyHandle`) no live tuner runs: those whose
    tuner sent no heartbeat within the grace (Optuna's check, for any host), and at once those of a tuner on
    this machine whose process is gone."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    machine = _this_machine()
    if machine is None:
        return
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        recorded_machine, _, recorded = str(TrialRecord.from_trial(trial).assignment.process or "").rpartition("/")
        if recorded_machine != machine or not recorded:
            continue
        try:
            process = psutil.Process(int(recorded.partition("@")[0]))
            alive = _process_start(process) == recorded and process.status() != psutil.STATUS_ZOMBIE
        except (ValueError, psutil.Error):  # no such process (or not one this reads): gone
            alive = False
        if not alive:
            _log.info("trial %d failed, to be run again: its tuner (%s) is gone", trial.number, recorded)
            try:
                handle.fail(trial.number)
            except optuna.exceptions.UpdateFinishedTrialError:  # another tuner failed it a moment ago
                continue


def trial_records(trials: Iterable[Any]) -> list[TrialRecord]:
    """The records of torchpace's Optuna trials (those it annotated: with a slot), in trial order."""
    records = [TrialRecord.from_trial(t) for t in trials]
    return [r for r in records if r.slot is not None]


@dataclass(frozen=True)
class BaselineGuard:
    """The curve every candidate's guard steps are compared with: the baseline's (none when there is no
    finished baseline, or when the guard cannot judge this workload, `cannot_judge` saying why)."""

    guard_losses: tuple[float, ...] = ()
    guard_metric: float | None = None
    cannot_judge: str | None = None
    scatter: bool = True  # the guard's rule (`check_guard`'s `scatter`): the study's, `policy.guard_scatter`


def baseline_guard(records: Iterable[TrialRecord], scatter: bool = True) -> BaselineGuard:
    """The guard's reference curve from the study's finished baseline trial.

    When the two baseline runs depart from each other by the guard's own rule, the guard cannot judge
    the workload: there is then no curve (every candidate's guard verdict is None) and `cannot_judge`
    says why.
    """
    records = list(records)
    first = next((r for r in records if r.slot == "baseline" and r.status == "ok"), None)
    # the defaults run again: the A/A comparison's (paired studies), or the second baseline (studies tuned before)
    again = next((r for r in records if r.slot in ("noise", "baseline#2") and r.status == "ok"), None)
    if first is None:
        return BaselineGuard(scatter=scatter)
    why = guard_cannot_judge(first, again, scatter) if again is not None else None
    if why:
        return BaselineGuard(cannot_judge=why, scatter=scatter)
    return BaselineGuard(first.guard_losses, first.guard_metric, scatter=scatter)


_NO_VERDICT = ("budget", "lost", "interrupted", "partner")  # cut by the budget, its tuner died or was stopped, its partner failed


def build_records(trials: Iterable[Any], scatter: bool = True) -> list[Record]:
    """Policy records from Optuna trials, with the guard checked against the baseline's curve by the study's
    rule (`scatter`: `policy.guard_scatter`)."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    waiting = (optuna.trial.TrialState.PRUNED.name, optuna.trial.TrialState.WAITING.name)
    records = [r for r in trial_records(trials) if r.state not in waiting]
    baseline = baseline_guard(records, scatter)
    return [_record(r, baseline) for r in records]


def record_status(record: TrialRecord) -> str:
    """How a trial ended: its stored status, `running` while it runs, `lost` when its tuner left none."""
    if record.running:
        return "running"
    return record.status or ("ok" if record.complete else "lost")


def _record(trial: TrialRecord, baseline: BaselineGuard) -> Record:
    status = record_status(trial)
    state = {"running": RUNNING}.get(status, RETRY if status in _NO_VERDICT else COMPLETE)
    verdict = check_trial_guard(baseline, trial, baseline.scatter) if status == "ok" else None
    bench, pair = trial.bench, trial.pair
    figure, ci_rel = trial.ranked_figure()
    return Record(trial.slot, dict(trial.assignment.config), state, status, figure, ci_rel, verdict.ok if verdict else None,
                  bench.input_bound_frac if bench else None, trial.verdict,
                  bench.throughput.warmup_converged if bench else None, bench.throughput.windows if bench else None,
                  script_settings=dict(bench.script.script_settings or {}) if bench and bench.script else {},
                  error=trial.error.strip().splitlines()[0] if trial.error.strip() and status != "ok" else "",
                  **_pair_fields(trial.assignment.reference, pair))


def _pair_fields(reference: Mapping[str, Any] | None, pair: PairRecord | None) -> dict[str, Any]:
    """The paired comparison of a trial as Record fields; {} for a trial measured alone."""
    if reference is None:
        return {}
    pair = pair or PairRecord()
    ref = pair.reference_bench
    return {"reference": dict(reference), "ratios": pair.ratios, "reference_figure": pair.reference_value,
            "reference_warmup_converged": ref.throughput.warmup_converged if ref is not None else None,
            "mode": pair.mode, "other_load_cores": pair.other_load_cores, "usable_cores": pair.usable_cores,
            "ended": pair.stopped_by == "ended"}
