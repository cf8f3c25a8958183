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
from typing import Any

from torchpace.errors import UsageError
from torchpace.tune.guard import check_trial_guard, guard_cannot_judge
from torchpace.tune.policy import COMPLETE, RETRY, RUNNING, Record
from torchpace.tune.storage import default_storage_url, open_storage  # noqa: F401  (where callers found them)

_log = logging.getLogger(__name__)

STUDY_KIND = "torchpace.study"
STUDY_SCHEMA_VERSION = 1
ATTR = "torchpace"


def study_metadata(workload: str, host, strategy: str) -> dict[str, Any]:
    """A new study's metadata; `paired`: greedy decides by paired comparisons (a study without it was tuned
    before they came, and is resumed and reported with the policy it was tuned with)."""
    return {"kind": STUDY_KIND, "schema_version": STUDY_SCHEMA_VERSION, "workload": workload,
            "host_fingerprint": host.fingerprint(), "host": host.summary(), "strategy": strategy,
            "paired": strategy == "greedy"}


def is_paired(meta: dict[str, Any] | None) -> bool:
    """Whether a study's greedy decisions are paired comparisons (False for studies tuned before)."""
    return bool((meta or {}).get("paired"))


def check_study_metadata(name: str, meta: dict | None, expected: dict[str, Any]) -> None:
    """UsageError when an existing study is not torchpace's, or was tuned elsewhere or on another workload."""
    if not meta or meta.get("kind") != STUDY_KIND:
        raise UsageError(f"study {name!r} exists but is not a torchpace study; choose another --study name")
    if meta.get("schema_version") != STUDY_SCHEMA_VERSION:
        raise UsageError(f"study {name!r} has torchpace study schema {meta.get('schema_version')!r}; this torchpace reads {STUDY_SCHEMA_VERSION}")
    for key, label in (("command", "command"), ("workload", "workload"), ("host_fingerprint", "host fingerprint"),
                       ("strategy", "strategy")):
        if meta.get(key) != expected.get(key):
            raise UsageError(f"study {name!r} was tuned with {label} {_shown(meta.get(key))}, not {_shown(expected.get(key))}: "
                             "its measurements do not transfer; use a new --study name")
    objective, wanted = meta.get("objective", "throughput"), expected.get("objective", "throughput")
    if objective != wanted:
        raise UsageError(f"study {name!r} was tuned for --objective {objective}, not {wanted}: its decisions compare "
                         "another figure; use a new --study name")


def _shown(value: Any) -> str:
    """A metadata value in a message: a command as the user typed it, anything else as repr."""
    return repr(" ".join(value)) if isinstance(value, list) else repr(value)


def open_study(storage, name: str, meta: dict[str, Any], resume: bool, sampler):
    """Create a new study, or (with `resume`) load and check an existing one."""
    import optuna

    existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    if name in existing:
        old_meta = existing[name].user_attrs.get(ATTR)
        check_study_metadata(name, old_meta, meta)
        if not resume and existing[name].n_trials:
            raise UsageError(f"study {name!r} already has {existing[name].n_trials} trials: pass --resume to continue it, "
                             "or --study NEW_NAME to start another")
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    if resume:
        raise UsageError(f"--resume: no study named {name!r} in this storage (known: {', '.join(existing) or 'none'})")
    try:
        study = optuna.create_study(study_name=name, storage=storage, sampler=sampler, direction="maximize")
    except optuna.exceptions.DuplicatedStudyError:
        raise UsageError(f"another tuner created study {name!r} a moment ago: pass --resume to work on it too") from None
    study.set_user_attr(ATTR, meta)
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
    import psutil

    machine = _this_machine()
    return None if machine is None else f"{machine}/{_process_start(psutil.Process())}"


def _process_start(process) -> str:
    """A psutil process as pid@start time (the start time is read from /proc, the same each time)."""
    return f"{process.pid}@{process.create_time():.2f}"


def fail_stale_trials(study) -> None:
    """Fail the running trials no live tuner runs: those whose tuner sent no heartbeat within the grace
    (Optuna's check, for any host), and at once those of a tuner on this machine whose process is gone."""
    import warnings

    import optuna
    import psutil

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    machine = _this_machine()
    if machine is None:
        return
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        recorded_machine, _, recorded = str(trial.system_attrs.get(ATTR, {}).get("process", "")).rpartition("/")
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
                study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:  # another tuner failed it a moment ago
                continue


def trial_info(trial) -> dict[str, Any]:
    """The torchpace attributes of an Optuna trial (empty for trials torchpace did not annotate)."""
    info = dict(trial.system_attrs.get(ATTR, {}))
    info.update(trial.user_attrs.get(ATTR, {}))
    return info


def baseline_info(infos) -> dict[str, Any]:
    """The torchpace info of the study's finished baseline trial (from (trial, info) pairs), or {}.

    When the two baseline runs depart from each other by the guard's own rule, the guard cannot judge
    the workload: the info then carries no guard curve (every candidate's guard verdict is None) and
    `guard_cannot_judge` says why.
    """
    first = next((i for _, i in infos if i.get("slot") == "baseline" and i.get("status") == "ok"), {})
    # the defaults run again: the A/A comparison's (paired studies), or the second baseline (studies tuned before)
    again = next((i for _, i in infos if i.get("slot") in ("noise", "baseline#2") and i.get("status") == "ok"), {})
    why = guard_cannot_judge(first, again) if first and again else None
    return {**first, "guard_losses": [], "guard_metric": None, "guard_cannot_judge": why} if why else first


def build_records(trials) -> list[Record]:
    """Policy records from Optuna trials, with the guard checked against the baseline's curve."""
    import optuna

    infos = [(t, trial_info(t)) for t in trials]
    baseline = baseline_info(infos)
    records = []
    for trial, info in infos:
        if "slot" not in info or trial.state in (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.WAITING):
            continue
        records.append(_record(trial, info, baseline))
    return records


def _record(trial, info: dict, baseline: dict) -> Record:
    import optuna

    state = {optuna.trial.TrialState.RUNNING: RUNNING}.get(trial.state, COMPLETE)
    status = info.get("status", "ok" if trial.state == optuna.trial.TrialState.COMPLETE else "lost")
    if status in ("budget", "lost", "interrupted", "partner"):
        state = RETRY  # cut by the budget, its tuner died or was stopped, its partner arm failed: no verdict
    if trial.state == optuna.trial.TrialState.RUNNING:
        state, status = RUNNING, "running"
    bench = info.get("bench") or {}
    verdict = check_trial_guard(baseline, info) if status == "ok" else None
    guard_ok = verdict.ok if verdict else None
    # the objective figure the tuner stored (samples/s, or 1 / p50 for latency); samples/s for older trials
    figure = info["objective_value"] if "objective_value" in info else bench.get("samples_per_s")
    ci_rel = info["objective_ci_rel"] if "objective_ci_rel" in info else bench.get("ci_rel_halfwidth")
    return Record(info["slot"], dict(info.get("config", {})), state, status, figure,
                  ci_rel, guard_ok, bench.get("input_bound_frac"), info.get("verdict"),
                  bench.get("warmup_converged"), bench.get("windows"), **_pair_fields(info))


def _pair_fields(info: dict) -> dict[str, Any]:
    """The paired comparison of a trial (`info["pair"]`, stored by the tuner) as Record fields; {} for a
    trial measured alone."""
    if info.get("reference") is None:
        return {}
    pair = info.get("pair") or {}
    load = [v for v in (pair.get("other_load_a"), pair.get("other_load_b")) if v is not None]
    return {"reference": dict(info["reference"]), "ratios": tuple(pair.get("ratios") or ()),
            "reference_samples_per_s": pair.get("reference_value"),
            "reference_warmup_converged": (pair.get("reference_bench") or {}).get("warmup_converged"), "mode": pair.get("mode"),
            "other_load_cores": max(load) if load else None}
