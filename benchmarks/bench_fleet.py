"""One study worked by 1, 2 and 3 tuner processes on PostgreSQL, and by 2 on SQLite (run: `make bench-fleet`).

Each run tunes the same cheap study (the tests' tiny MLP, two knobs, 1 s trials) from scratch with real
`torchpace tune` processes on this host, against a throw-away PostgreSQL server (tests/_postgres.py) or a
fresh SQLite file. Printed per run: wall time, finished trials, trials per minute, the time the tuners
spent outside trial processes (waiting for trials other tuners held, choosing, storing), and the
assignment-lock waits (tuners taking turns to choose their next trial).

On a host with fewer cores than tuners, the tuners and their trial processes share the cores: the
figures then show what coordination costs, not the speed-up a fleet of separate hosts gets.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _args import seconds

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from _postgres import ThrowawayPostgres, install_server, start_fleet  # noqa: E402
from _support import fixture_workload  # noqa: E402

STUDY = "bench-fleet"
KNOBS = ("data.num_workers", "optimizer.impl")
_RUN_TIMEOUT_S = 1200


def tune_cmd(url: str, out: Path, trial_time_s: float, *extra: str) -> list[str]:
    knobs = [arg for name in KNOBS for arg in ("--knob", name)]
    return [sys.executable, "-m", "torchpace", "tune", fixture_workload("tiny_mlp"), "--storage", url, "--study", STUDY,
            "--out", str(out), "--trial-time", str(trial_time_s), "--guard-steps", "6", *knobs, "--json", *extra]


def run_fleet(url: str, workers: int, workdir: Path, trial_time_s: float) -> dict:
    """Tune the study with `workers` tuner processes; wall time and what the records say."""
    start = time.perf_counter()
    procs = start_fleet(lambda i, *extra: tune_cmd(url, workdir / f"w{i}.toml", trial_time_s, *extra),
                        url, STUDY, workers, workdir)
    failed = [p.communicate(timeout=_RUN_TIMEOUT_S)[1][-800:] for p in procs if p.wait(timeout=_RUN_TIMEOUT_S) != 0]
    wall_s = time.perf_counter() - start
    if failed:
        raise SystemExit(f"a tuner failed: {failed[0]}")
    return {"wall_s": wall_s, **summarize_trials(url)}


def summarize_trials(url: str) -> dict:
    """Finished trials, time outside trial processes and assignment-lock waits, from the study's records."""
    import optuna

    from torchpace.tune.attrs import TrialRecord
    from torchpace.tune.storage import resolve_storage_url

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    trials = optuna.load_study(study_name=STUDY, storage=resolve_storage_url(url)).get_trials(deepcopy=False)
    measured = [(t, TrialRecord.from_trial(t)) for t in trials if t.datetime_complete]
    measured = [(t, r) for t, r in measured if r.wall_time_s is not None]
    outside_s = sum((t.datetime_complete - t.datetime_start).total_seconds() - r.wall_time_s for t, r in measured)
    return {"trials": len(measured), "outside_trials_s": outside_s,
            "lock_wait_s": sum(r.assignment.lock_wait_s or 0.0 for _, r in measured),
            "workers_seen": len({r.assignment.worker for _, r in measured})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trial-time", type=seconds, default=1.0, help="measurement cap per trial, seconds")
    args = parser.parse_args()
    missing = install_server()
    if missing:
        raise SystemExit(missing)
    server = ThrowawayPostgres.start()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            for storage, workers in (("postgresql", 1), ("postgresql", 2), ("postgresql", 3), ("sqlite", 2)):
                workdir = Path(tmp) / f"{storage}-{workers}"
                workdir.mkdir()
                url = (server.create_database(f"fleet{workers}").replace("+psycopg", "") if storage == "postgresql"
                       else f"sqlite:///{workdir / 'studies.db'}")
                print(f"{storage} x{workers} ...", flush=True)
                rows.append((storage, workers, run_fleet(url, workers, workdir, args.trial_time)))
    finally:
        server.stop()
    print_table(rows)


def print_table(rows: list[tuple[str, int, dict]]) -> None:
    base_wall_s = rows[0][2]["wall_s"]
    print(f"\nhost: {os.cpu_count()} logical CPUs; study: tiny MLP, knobs {', '.join(KNOBS)}")
    print(f"{'storage':<11}{'tuners':>7}{'wall s':>9}{'vs 1':>7}{'trials':>8}{'trials/min':>12}"
          f"{'outside trials s':>18}{'lock wait s':>13}{'tuners used':>13}")
    for storage, workers, r in rows:
        print(f"{storage:<11}{workers:>7}{r['wall_s']:>9.1f}{r['wall_s'] / base_wall_s:>6.2f}x{r['trials']:>8}"
              f"{60 * r['trials'] / r['wall_s']:>12.1f}{r['outside_trials_s']:>18.1f}{r['lock_wait_s']:>13.3f}"
              f"{r['workers_seen']:>13}")
    if (os.cpu_count() or 1) < 3 * 2:
        print(f"\nThis host has {os.cpu_count()} logical CPUs: the tuners and their trial processes share them, so these "
              "figures show coordination overhead, not the speed-up of tuners on separate hosts.")


if __name__ == "__main__":
    main()
