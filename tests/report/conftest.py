"""Fixtures of the report tests: one real tiny tune (run once per session) and headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from _support import apt_install, fixture_workload

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


STUDY = "report-tiny"
WORKLOAD = "raises_with_two_workers"
EXPECTED_STATUSES = {"baseline": "ok", "noise": "ok", "pair:data.num_workers=1": "ok", "pair:data.num_workers=2": "crash"}
_TUNE_TIMEOUT_S = 600


@dataclass(frozen=True)
class TunedStudy:
    """What one real `torchpace tune --report --json` run left: the study file, its outcome, its report."""

    db: Path
    name: str
    outcome: dict
    report: Path
    stderr: str
    host: dict


@pytest.fixture(scope="session")
def tuned_study(tmp_path_factory, host) -> TunedStudy:
    """A real greedy tune over data.num_workers, run once per session as a user runs it.

    The workload is the tiny MLP whose dataset raises in its DataLoader workers when there are two of
    them: one study then holds baseline, re-measure, an ok candidate and a crashed one, and the
    same run exercises `tune --report` (a second tune would double the suite's time).
    """
    directory = tmp_path_factory.mktemp("tuned")
    db, report = directory / "studies.db", directory / "tune-report.html"
    argv = ["tune", fixture_workload(WORKLOAD), "--knob", "data.num_workers", "--trial-time", "1",
            "--guard-steps", "6", "--storage", f"sqlite:///{db}", "--study", STUDY, "--out", str(directory / "torchpace.toml"),
            "--report", str(report), "--json"]
    done = subprocess.run([sys.executable, "-m", "torchpace", *argv], capture_output=True, text=True, cwd=directory,
                          timeout=_TUNE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout)
    statuses = {t["slot"]: t["status"] for t in outcome["trials"]}
    seen = "\n".join(f"{t['slot']}: {t['status']} {(t.get('error') or '')[-600:]}" for t in outcome["trials"])
    # a candidate compared again (its first comparison unsettled, or its CI reaching 1) adds a `confirm-pair`
    # slot, and a kept one the `final` comparison with the defaults: the same study for these tests
    extra = {slot: status for slot, status in statuses.items() if slot not in EXPECTED_STATUSES}
    assert {slot: statuses.get(slot) for slot in EXPECTED_STATUSES} == EXPECTED_STATUSES and all(
        slot.startswith(("confirm-pair:", "final")) and status == "ok" for slot, status in extra.items()), \
        f"{seen}\nfailed_baseline: {outcome.get('failed_baseline')}\n{done.stderr[-2000:]}"
    return TunedStudy(db, STUDY, outcome, report, done.stderr, host.summary())


def find_chromium() -> str | None:
    """The first Chromium-like browser on PATH."""
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path), None)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path of a headless-capable Chromium: Debian's `chromium`, installed with apt when root; else skip."""
    missing = apt_install(("chromium",), lambda: find_chromium() is not None)
    if missing:
        pytest.skip(f"the browser test needs Chromium: {missing}")
    return find_chromium()
