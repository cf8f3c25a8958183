"""Reading what a report shows: a torchpace study, or a saved bench or profile result.

The kind of input is told by its content, never by its file name: an SQLite file holding Optuna's
tables is a study storage; a JSON object whose `kind` is `torchpace.bench`, `torchpace.compare` or
`torchpace.profile` is a result. Anything else is a usage error that says what was expected.

A stored study is turned into the same `TuneOutcome` a live tune returns, by the tuner's own
code (`torchpace.tune.outcome.build_outcome`): the greedy policy is replayed over the stored
trials, so the accepted changes and the speedup read exactly as `torchpace tune` printed them.

Effects (files, databases) live in the `load_*`/`read_*` functions; the `build_*`/`pick_*`
functions are pure. Everything returned is frozen data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

from torchpace.errors import UsageError
from torchpace.host import host_summary_problem
from torchpace.measure.comparison import RESULT_KIND as COMPARE_KIND
from torchpace.measure.comparison import Comparison
from torchpace.knobs import REGISTRY, knobs_in_stage_order
from torchpace.measure.result import RESULT_KIND as BENCH_KIND
from torchpace.measure.result import BenchResult
from torchpace.profile.result import RESULT_KIND as PROFILE_KIND
from torchpace.profile.result import ProfileResult
from torchpace.records import MissingFields, type_problem
from torchpace.tune.attrs import StudyAttrs
from torchpace.tune.outcome import StudyMeta, TrialRow, TuneOutcome, build_guard_note, build_outcome, trial_rows
from torchpace.tune.space import KnobSpace
from torchpace.tune.storage import mask_url, sqlite_database  # noqa: F401  (mask_url: report/__init__ imports it here)
from torchpace.tune.storage import STUDY_CORE_TABLES, open_storage, read_table_names
from torchpace.tune.strategy import make_strategy
from torchpace.tune.study import check_stored_study

SQLITE_MAGIC = b"SQLite format 3\x00"
_SUPPORTED_RESULT_SCHEMA = 1
EXPECTED = ("a torchpace study (the SQLite file `torchpace tune` writes, e.g. .torchpace/studies.db; or "
            "--storage URL), or a JSON result: `torchpace bench --out FILE` (kind torchpace.bench), "
            "`torchpace compare --out FILE` (kind torchpace.compare) or `torchpace profile --json > FILE` "
            "(kind torchpace.profile)")
_RESULT_KINDS = (BENCH_KIND, COMPARE_KIND, PROFILE_KIND)


@dataclass(frozen=True)
class DoctorSummary:
    """The doctor's findings that are not ok, on the machine that rendered the report.

    Attributes:
        findings: `Finding.to_dict()` of every finding whose severity is not ok, worst first.
        counts: number of findings per severity (ok included).
        rendered_on: distro, Python and torch version of the machine the doctor ran on.
        other_host: why the measured host looks like another machine (None when it looks the same).
    """

    findings: tuple[Mapping[str, Any], ...]
    counts: Mapping[str, int]
    rendered_on: Mapping[str, Any]
    other_host: str | None = None


@dataclass(frozen=True)
class ReportData:
    """Everything one report shows. Exactly one of `tune`, `bench`, `compare` and `profile` is set.

    Attributes:
        kind: ``study``, ``bench``, ``compare`` or ``profile``.
        source: what was read (a file, or a storage URL without its password, and the study name).
        workload: the workload spec that was measured.
        config: the final config (tuned, benched or profiled): knob name -> value, defaults left out.
        host: the measured host's summary (`HostFacts.summary()`), None when the input has none.
        tune: the outcome of a study.
        bench: a bench result.
        compare: a comparison of two configs (its `config` is B's, the one compared with A).
        profile: a profile result.
        config_path: where the config was saved as TOML, when known.
        note: a line about how the input was read (e.g. which of several studies).
        doctor: the doctor's summary, when it ran.
        command: script mode: the unmodified command that was measured (`python train.py ARGS`), else None.
    """

    kind: str
    source: str
    workload: str
    config: Mapping[str, Any] = field(default_factory=dict)
    host: Mapping[str, Any] | None = None
    tune: TuneOutcome | None = None
    bench: BenchResult | None = None
    profile: ProfileResult | None = None
    config_path: str | None = None
    note: str | None = None
    doctor: DoctorSummary | None = None
    command: tuple[str, ...] | None = None
    compare: Comparison | None = None


# ---- dispatch --------------------------------------------------------------------------------------


def load_report_data(path: str | None, *, storage: str | None = None, study: str | None = None) -> ReportData:
    """Read a study or a result into `ReportData`.

    Args:
        path: a study's SQLite file or a result JSON file; None with `storage`.
        storage: an Optuna RDB URL (instead of `path`).
        study: the study's name; default the only (or most recent) torchpace study in the storage.

    Raises:
        UsageError: the input is missing, is not a torchpace study or result, or names no study.
    """
    if (path is None) == (storage is None):
        raise UsageError(f"give STUDY_OR_RESULT or --storage URL (one of them): {EXPECTED}")
    if storage is not None:
        check_holds_study(storage, mask_url(storage))  # else Optuna would create an empty study storage there
        return load_study(storage, study, mask_url(storage))
    if read_input_kind(path) == "sqlite":
        url = f"sqlite:///{Path(path).resolve()}"
        check_holds_study(url, repr(str(path)))
        return load_study(url, study, str(path))
    if study is not None:
        raise UsageError(f"--study {study!r} applies to a study storage, and {path!r} is a JSON result")
    return build_result_data(read_result_json(path), str(path))


def read_input_kind(path: str | Path) -> str:
    """``sqlite`` when the file starts with SQLite's header, else ``json`` (UsageError when unreadable)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except OSError as err:
        raise UsageError(f"cannot read {str(path)!r}: {err.strerror}; expected {EXPECTED}") from None
    return "sqlite" if head == SQLITE_MAGIC else "json"


def read_result_json(path: str | Path) -> dict[str, Any]:
    """The JSON object in `path` (UsageError when it does not parse)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"{str(path)!r} is neither a torchpace study nor a JSON result ({err}); "
                         f"expected {EXPECTED}") from None
    return doc


# ---- results ---------------------------------------------------------------------------------------


def build_result_data(doc: Mapping[str, Any], source: str) -> ReportData:
    """ReportData of a bench, compare or profile result document (pure; UsageError for other documents,
    naming what the document is when it is another torchpace document)."""
    kind = doc.get("kind") if isinstance(doc, Mapping) else None
    if isinstance(kind, str) and kind.startswith("torchpace.") and kind not in _RESULT_KINDS:
        raise UsageError(f"{source!r} is a torchpace document of kind {kind!r}, which report does not render; "
                         f"report reads {EXPECTED}")
    if kind not in _RESULT_KINDS:
        raise UsageError(f"{source!r} is JSON but not a torchpace result (kind {kind!r}); expected {EXPECTED}")
    if doc.get("schema_version") != _SUPPORTED_RESULT_SCHEMA:
        raise UsageError(f"{source!r} has {kind} schema_version {doc.get('schema_version')!r}; this torchpace reads "
                         f"{_SUPPORTED_RESULT_SCHEMA} (a newer torchpace wrote it?)")
    problem = host_summary_problem(doc.get("host"))
    if problem:
        raise UsageError(f"{source!r} is a {kind} result whose host record is not one ({problem}): it was changed or "
                         "damaged outside torchpace; measure again to write it anew")
    if kind == BENCH_KIND:
        bench = read_bench(doc, source)
        command = bench.script.command if bench.script is not None else ()
        return ReportData("bench", source, bench.workload, dict(bench.config), host=bench.host or None, bench=bench,
                          command=tuple(command) or None)
    if kind == COMPARE_KIND:
        comparison = read_comparison(doc, source)
        return ReportData("compare", source, comparison.target, dict(comparison.b.config), compare=comparison)
    profile = read_profile(doc, source)
    return ReportData("profile", source, profile.workload, dict(profile.config), profile=profile, command=profile.command)


def read_profile(doc: Mapping[str, Any], source: str) -> ProfileResult:
    """The profile result of a document (UsageError naming a field it lacks or a value it cannot read)."""
    try:
        return ProfileResult.from_dict(doc)
    except KeyError as err:
        raise UsageError(f"{source!r} is a profile result without the field {err.args[0]!r}; write it again with "
                         "`torchpace profile --json > FILE`") from None
    except (TypeError, ValueError) as err:
        raise UsageError(f"{source!r} is a profile result this torchpace cannot read ({err}); write it again with "
                         "`torchpace profile --json > FILE`") from None


def read_comparison(doc: Mapping[str, Any], source: str) -> Comparison:
    """The comparison of a document (UsageError naming the fields it lacks or a value it cannot read)."""
    return _read_record(Comparison, doc, source, "compare", "torchpace compare --out FILE")


def read_bench(doc: Mapping[str, Any], source: str) -> BenchResult:
    """The bench result of a document of any version written so far (UsageError naming the fields it lacks or a
    value it cannot read)."""
    return _read_record(BenchResult, doc, source, "bench", "torchpace bench --out FILE")


def _read_record(record, doc: Mapping[str, Any], source: str, verb: str, writes_it: str):
    problem = type_problem(record, doc)  # a hand-edited or damaged value: named here, never a traceback when shown
    if problem:
        raise UsageError(f"{source!r} is a {verb} result this torchpace cannot read ({problem}); write it again with "
                         f"`{writes_it}`")
    try:
        return record.from_dict(doc)
    except MissingFields as err:
        raise UsageError(f"{source!r} is a {verb} result without the field(s) {', '.join(err.names)}; write it again "
                         f"with `{writes_it}`") from None
    except (TypeError, ValueError, AttributeError) as err:  # a field of the wrong type: a file edited or damaged
        raise UsageError(f"{source!r} is a {verb} result this torchpace cannot read ({err}); write it again with "
                         f"`{writes_it}`") from None


# ---- studies ---------------------------------------------------------------------------------------


def check_holds_study(url: str, source: str) -> None:
    """UsageError unless the database holds Optuna's tables (read without writing: never creates them)."""
    if not STUDY_CORE_TABLES <= read_table_names(url):
        kind = "an SQLite database" if sqlite_database(url) else "a database"
        raise UsageError(f"{source} is {kind} but holds no Optuna study; expected {EXPECTED}")


def load_study(url: str, name: str | None, source: str) -> ReportData:
    """Read a torchpace study from Optuna storage `url` into ReportData."""
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(url, read_only=True)
    summaries = optuna.get_all_study_summaries(storage, include_best_trial=False)
    candidates = [(s.study_name, StudyAttrs.of(s), s.datetime_start, index) for index, s in enumerate(summaries)]
    chosen, note = pick_study(candidates, name, source)
    meta = next(meta for study_name, meta, _, _ in candidates if study_name == chosen)
    study = optuna.load_study(study_name=chosen, storage=storage, sampler=optuna.samplers.RandomSampler())
    outcome = build_stored_outcome(study, chosen, mask_url(url), meta)
    return build_tune_data(outcome, meta.host, f"{source} (study {chosen!r})", note=note)


def pick_study(candidates: list[tuple[str, StudyAttrs | None, datetime | None, int]], wanted: str | None,
               source: str) -> tuple[str, str | None]:
    """The study to report, and a note when it was chosen among several (pure).

    Args:
        candidates: (name, torchpace metadata or None, first trial's start, creation order) per study.
        wanted: the name asked for, or None for the only / most recently started torchpace study.
        source: how to name the storage in messages.
    """
    ours = [c for c in candidates if c[1] is not None]
    names = ", ".join(c[0] for c in ours) or "none"
    if wanted is not None and wanted not in {c[0] for c in candidates}:
        raise UsageError(f"--study {wanted!r}: no such study in {source} (torchpace studies: {names})")
    if wanted is not None and wanted not in {c[0] for c in ours}:
        raise UsageError(f"--study {wanted!r} in {source} is not a torchpace study (torchpace studies: {names})")
    if not ours:
        raise UsageError(f"{source} holds no torchpace study; expected {EXPECTED}")
    note = None
    if wanted is None:
        wanted = max(ours, key=lambda c: (c[2] or datetime.min, c[3]))[0]
        if len(ours) > 1:
            note = f"{len(ours)} torchpace studies in {source} ({names}); this report shows {wanted!r} (choose with --study NAME)"
    check_stored_study(wanted, next(c[1] for c in ours if c[0] == wanted))
    return wanted, note


def build_stored_outcome(study, name: str, url: str, meta: StudyAttrs) -> TuneOutcome:
    """The `TuneOutcome` of a stored study, built by the tuner's own `build_outcome`.

    The greedy policy is replayed over the knobs and values the study tried (`rebuild_space`);
    `stopped` says whether that replay finds the search complete.
    """
    rows = trial_rows(study, meta.objective)
    strategy = make_strategy(meta.strategy, rebuild_space(rows, meta.defaults), stored=meta)
    if not strategy.guard_scatter:  # a greedy study tuned before revision 6: its guard's verdicts by the rule then
        rows = trial_rows(study, meta.objective, scatter=False)
    base = next((r for r in rows if r.slot == "baseline" and r.status == "ok"), None)
    state = strategy.replay(study.get_trials(deepcopy=False))
    stopped = "stored"  # a search that decides nothing step by step
    if state is not None:
        stopped = "done" if state.done else ("baseline failed" if state.failed_baseline else "unfinished")
    study_meta = StudyMeta(name, url, meta.strategy, meta.workload or "?", meta.objective,
                           build_guard_note(len(base.guard_losses) if base else 0), command=meta.command)
    return build_outcome(rows, state, study_meta, stopped)


def rebuild_space(rows: Sequence[TrialRow], defaults: Mapping[str, Any] | None = None) -> list:
    """The searched part of the space, from the candidate trials: each tried knob, default first (pure).

    Every value the greedy policy proposed left a candidate trial, so replaying over this space
    reaches the same decisions; knobs that were never tried (an interrupted tune) are simply absent.
    Knobs are in the registry's stage order, as the tuner built them. A knob's default is the study's
    (`StudyAttrs.defaults`: the workload's own value) where it has one, else the registry's.
    """
    defaults = defaults or {}
    tried: dict[str, list] = {}
    stages: dict[str, str] = {}
    for row in rows:
        if row.kind == "candidate" and row.knob in REGISTRY:
            values = tried.setdefault(row.knob, [])
            if row.value not in values:
                values.append(row.value)
            stages[row.knob] = row.stage
    order = [k.name for k in knobs_in_stage_order()]
    return [KnobSpace(stages[n], n, defaults.get(n, REGISTRY[n].default), (defaults.get(n, REGISTRY[n].default), *tried[n]),
                      shares_cores=REGISTRY[n].shares_cores)
            for n in sorted(tried, key=order.index)]


def build_tune_data(outcome: TuneOutcome, host: Mapping[str, Any] | None, source: str,
                    config_path: str | None = None, note: str | None = None) -> ReportData:
    """ReportData of a tune outcome (pure); a script study's `command` is its outcome's."""
    return ReportData("study", source, outcome.workload, dict(outcome.best_config), host=host or None, tune=outcome,
                      config_path=config_path or outcome.out_path, note=note, command=outcome.command)
