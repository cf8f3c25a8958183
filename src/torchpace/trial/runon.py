"""The run-on check: a config runs the script past its measured steps, through its first save or evaluation.

Every trial ends the script when its measurement is over, so a knob that breaks what the script does later (a
whole-module `torch.save` of a compiled model, an evaluation, an export) is never seen by one. Before a tune
writes its config, `run_on` runs the script once more under that config, planned exactly as `launch --config`
plans it (`plan_script_launch`), with the run-on hook (`torchpace.script.runon`) noting the script's saves,
evaluations, traces and exports after its first step. The run ends at the first of:

- the script ends by itself: `ended` when its exit status is 0, else `failed`;
- it has stepped again after a save or an evaluation: `past` (torchpace stops it there);
- `limit_s` passed: `unreached` (no save or evaluation within it: nothing past the measured steps was checked),
  or `past` if one happened and the script was still in it (an evaluation longer than the rest of the limit).

`failed` is the script's exit status and its last output lines. `find_culprit` then takes it apart: the same run
with the defaults (a failure there too is the script's own, not the config's), and with each knob of the
config taken back in turn (the first whose removal lets the run get as far without failing is named).
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchpace.config import RunConfig
from torchpace.files import open_fresh, own_folder
from torchpace.host import HostFacts
from torchpace.process import exit_code, start_child, stop_tree
from torchpace.script.runon import LIFE_EVENTS, RUN_ON_ENV, STEP
from torchpace.stop_policy import temporary_folder
from torchpace.trial.script import plan_script_launch

_log = logging.getLogger(__name__)

ENDED, PAST, UNREACHED, FAILED = "ended", "past", "unreached", "failed"
_POLL_S = 0.25
_STOP_GRACE_S = 5.0  # between SIGTERM and SIGKILL when torchpace ends the run
_TAIL_LINES = 12


@dataclass(frozen=True)
class RunOn:
    """How one run of the script past its measured steps went (see the module docstring).

    Attributes:
        status: `ended`, `past`, `unreached` or `failed`.
        wall_s: from the start to the end of the run.
        events: the script's saves, evaluations, traces and exports seen, in order (`save at main.py:240`).
        error: `failed`: how the script ended and its last output lines.
        config: the knob values it ran with.
    """

    status: str
    wall_s: float
    events: tuple[str, ...] = ()
    error: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in (ENDED, PAST)

    def describe(self) -> str:
        seen = f" ({', '.join(self.events[:3])})" if self.events else ""
        if self.status == ENDED:
            return f"the script ran to its end in {self.wall_s:.0f} s{seen}"
        if self.status == PAST:
            return f"the script ran past its first save or evaluation{seen}, {self.wall_s:.0f} s in"
        if self.status == UNREACHED:
            return f"the script reached no save or evaluation within {self.wall_s:.0f} s: nothing after its measured steps was checked"
        lines = self.error.splitlines()
        last = next((line.strip(" |") for line in reversed(lines[1:]) if line.strip(" |")), "")
        return f"the script failed after {self.wall_s:.0f} s{seen}: {lines[0].partition(';')[0] if lines else ''}" + (
            f" ({last})" if last else "")

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "wall_s": round(self.wall_s, 1), "events": list(self.events),
                "error": self.error, "config": dict(self.config)}


@dataclass(frozen=True)
class RunOnCheck:
    """The run-on check of a tuned config: its run, and where it failed, what the failure came from.

    Attributes:
        run: the tuned config's run.
        culprit: the knob whose removal let the script get past where it failed (None: none found alone).
        own_failure: the script failed the same way with the defaults: the failure is the script's own.
        kept: the config a tune writes: the tuned config, less the culprit; the defaults when no single knob was
            found and the defaults ran past where the config failed.
        runs: every run made, the tuned config's first.
    """

    run: RunOn
    kept: Mapping[str, Any]
    culprit: str | None = None
    own_failure: bool = False
    runs: tuple[RunOn, ...] = ()

    def describe(self) -> str:
        text = self.run.describe()
        if self.run.ok or self.run.status == UNREACHED:
            return text
        if self.own_failure:
            return text + "; with the defaults it failed too: the script's own failure, not the config's"
        if self.culprit is not None:
            return text + f"; without {self.culprit} it did not fail: {self.culprit} is taken back from the config"
        if not self.kept:
            return text + "; no single knob taken back made it pass, the defaults did: the defaults are kept"
        return text + "; neither the defaults nor the config less one knob got as far: the config is kept as measured"

    def to_dict(self) -> dict[str, Any]:
        return {**self.run.to_dict(), "culprit": self.culprit, "own_failure": self.own_failure,
                "kept": dict(self.kept), "runs": [run.to_dict() for run in self.runs]}


Runner = Callable[[Mapping[str, Any]], RunOn]


def run_on(command: Sequence[str], config: Mapping[str, Any], host: HostFacts, base_env: Mapping[str, str],
           limit_s: float, log_path: Path, clock: Callable[[], float] = time.monotonic) -> RunOn:
    """Run `command` under `config` past its measured steps (see the module docstring); its output goes to `log_path`."""
    plan = plan_script_launch(command, RunConfig(dict(config)), host, base_env)
    own_folder(log_path.parent)
    with temporary_folder("torchpace-run-on-") as folder, open_fresh(log_path) as log:
        events_path = folder / "events.jsonl"
        start = clock()
        proc = start_child(list(plan.argv), death_signal=signal.SIGKILL, nofile=plan.nofile,
                           env={**plan.env, RUN_ON_ENV: str(events_path)}, stdout=log, stderr=log)
        _log.info("run-on check of %s started (pid %d, up to %.0f s)", dict(config) or "the defaults", proc.pid, limit_s)
        try:
            returncode, past = _wait(proc, events_path, start + limit_s, clock)
        finally:
            stop_tree(proc, _STOP_GRACE_S)
        events = _life_events(events_path)
        wall_s = clock() - start
    if returncode is None:  # torchpace stopped it: past its save or evaluation, or at the limit
        return RunOn(PAST if past or events else UNREACHED, wall_s, events, config=dict(config))
    if returncode == 0:
        return RunOn(ENDED, wall_s, events, config=dict(config))
    return RunOn(FAILED, wall_s, events, error=_failure(returncode, log_path), config=dict(config))


def _wait(proc: subprocess.Popen, events_path: Path, deadline: float, clock) -> tuple[int | None, bool]:
    """(exit status, False) when the script ended by itself; (None, past) when the run is to be stopped."""
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(_POLL_S, deadline - clock()))), False
        except subprocess.TimeoutExpired:
            pass
        if _stepped_after_life_event(events_path):
            return None, True
        if clock() >= deadline:
            return None, False


def _read(events_path: Path) -> list[dict[str, Any]]:
    try:
        text = events_path.read_text()
    except FileNotFoundError:
        return []
    lines = text.splitlines()
    return [json.loads(line) for line in lines if line.strip().endswith("}")]


def _stepped_after_life_event(events_path: Path) -> bool:
    return any(event.get("event") == STEP for event in _read(events_path))


def _life_events(events_path: Path) -> tuple[str, ...]:
    seen: list[str] = []
    for event in _read(events_path):
        if event.get("event") in LIFE_EVENTS:
            text = f"{event['event']} at {event.get('where') or '?'}"
            if text not in seen:
                seen.append(text)
    return tuple(seen)


def _failure(returncode: int, log_path: Path) -> str:
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {exit_code(returncode)}"
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    tail = [line for line in lines if line.strip()][-_TAIL_LINES:]
    return how + ("; its last output lines:\n" + "\n".join(f"  | {line}" for line in tail) if tail else "")


def find_culprit(config: Mapping[str, Any], run: Runner) -> RunOnCheck:
    """Run `config` past its measured steps; where it fails, run the defaults, then the config less each knob in
    turn, to say whether the failure is the script's own or which knob caused it."""
    first = run(config)
    if first.ok or first.status == UNREACHED or not config:
        return RunOnCheck(first, dict(config), runs=(first,), own_failure=not config and first.status == FAILED)
    runs = [first]
    defaults = run({})
    runs.append(defaults)
    if defaults.status == FAILED:
        return RunOnCheck(first, dict(config), own_failure=True, runs=tuple(runs))
    for name in config:
        without = {k: v for k, v in config.items() if k != name}
        attempt = run(without)
        runs.append(attempt)
        if attempt.ok:  # got as far without failing (a run that reached nothing proves nothing)
            return RunOnCheck(first, without, culprit=name, runs=tuple(runs))
    return RunOnCheck(first, {} if defaults.ok else dict(config), runs=tuple(runs))


__all__ = ["ENDED", "PAST", "UNREACHED", "FAILED", "RunOn", "RunOnCheck", "run_on", "find_culprit"]
