"""Parent side of a trial: plan the child's argv and env with the one child planner (`plan_trial`), run
`python -m torchpace.trial` (under torchrun for `nproc_per_node > 1`, see `ranks.py`) in its own
process group, enforce the timeout, and kill the whole group and every process it started
(DataLoader workers and torchrun's ranks, which sit in sessions of their own) on timeout, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping, TextIO

import psutil

from torchpace.config import RunConfig
from torchpace.errors import UsageError
from torchpace.files import check_disk_left, open_fresh, own_folder, writing
from torchpace.host import HostFacts
from torchpace.knobs.distributed import nproc_of
from torchpace.launch.command import PythonCommand
from torchpace.launch.plan import ChildOptions, LaunchFacts, LaunchPlan, plan_child
from torchpace.launch.probe import probe_launch_facts
from torchpace.process import start_child, stop_tree
from torchpace.stop_policy import temporary_folder
from torchpace.trial.output import follow
from torchpace.trial.script import END_GRACE_S, FAILED_GRACE_S, JobWatch, plan_script_trial, read_script_result
from torchpace.protocol import (CRASH, INVALID, STACK_DUMP_SIGNAL, TrialResult, TrialSpec, classify_exit,
                                classify_timeout)
from torchpace.trial.ranks import all_ranks_stderr, read_rank_failure

_log = logging.getLogger(__name__)

_STDERR_TAIL_BYTES = 4000
_KILL_GRACE_S = 3.0  # SIGTERM first, then SIGKILL after this
_DUMP_WAIT_S = 2.0  # at most this long for the dumps, before the group is killed
_DUMP_SETTLED_S = 0.2  # the dumps are written once stderr stopped growing this long
_TRIAL_DIR_PREFIX = "torchpace-trial-"  # + the pid of the process running the trial
_POLL_S = 0.25  # how often a script-mode trial's files are looked at while it runs (`JobWatch`)


def plan_trial(config: Mapping[str, object], host: HostFacts, base_env: Mapping[str, str], spec_path: Path,
               result_path: Path, facts: LaunchFacts | None = None) -> LaunchPlan:
    """The trial child's plan from the one child planner (`plan_child`, which `launch` runs too).

    The child is `python -m torchpace.trial SPEC RESULT` (under torchrun for `nproc_per_node > 1`),
    with the config's process-level settings in its env and argv: the config's values win over
    variables already in `base_env` (a trial must run the value it measures), what the config does
    not set is left as plain PyTorch runs it, and the child applies the other knobs with prepare().

    Args:
        config: the trial's knob values.
        host: this machine's facts (allocators, numactl, NUMA nodes, GPUs).
        base_env: the environment the child starts from (never modified).
        spec_path, result_path: the trial's files.
        facts: this process's interpreter, limits and CPUs (default: probed here).

    Raises:
        UsageError: the config needs a tool this host lacks (numactl, an allocator).
    """
    command = PythonCommand(module="torchpace.trial", args=(str(spec_path), str(result_path)))
    options = ChildOptions(command, facts or probe_launch_facts(), "the trial's config", config_over_env=True, prepared=True)
    return plan_child(RunConfig(dict(config)), host, base_env, options)


def run_trial(spec: TrialSpec, host: HostFacts, timeout_s: float, base_env: Mapping[str, str] | None = None,
              workdir: Path | None = None, log_path: Path | None = None, echo: TextIO | None = None) -> TrialResult:
    """Run one trial in a child process and return its result (never raises for the child's failures).

    Args:
        log_path: script mode: keep the script's stdout and stderr in this file (its folder is made);
            default: a file in the trial's temporary folder, gone with it.
        echo: script mode: also copy the script's output here as it comes (`--show-output`).
    """
    base_env = os.environ if base_env is None else base_env
    remove_orphan_trial_dirs(workdir)
    with trial_dir(workdir) as tmp:
        spec_path, result_path, err_path = trial_paths(tmp, spec, log_path)
        with writing(spec_path):
            spec.save(spec_path)
        try:
            argv, env, nofile = plan_trial_child(spec, host, base_env, spec_path, result_path, timeout_s)
        except UsageError as err:  # e.g. numactl or an allocator the config needs is not installed
            return TrialResult(INVALID, error=str(err))
        start = time.perf_counter()
        dead: list[int] = []
        said = ""  # what the trial had written to stderr by its cap
        with open_trial_output(err_path) as err_file, follow(err_path, echo if spec.command else None):
            proc = start_child(argv, death_signal=signal.SIGKILL, nofile=nofile, env=env, stderr=err_file,
                               stdout=child_stdout(spec, err_file))
            _log.info("trial process %d started (cap %.0f s) for %s", proc.pid, timeout_s, spec.config or "the defaults")
            ended_by = None  # what ended a script's tree early: its result, or a rank that failed or died
            try:
                returncode, ended_by = wait_trial(proc, spec, result_path, timeout_s)
            except subprocess.TimeoutExpired:
                # the evidence is what the trial left before we act on it: its zombies and what it had said
                # (killing the group makes DataLoader workers die, and their parent say so)
                returncode, dead = None, dead_children(proc.pid)
                said = all_ranks_stderr(result_path) + _tail(err_path)
                dump_stacks(proc.pid, [err_path, *result_path.parent.glob("stderr.rank*.txt")])
            finally:  # also on Ctrl-C / SIGTERM of the parent: leave nothing behind (workers, ranks)
                stop_tree(proc, _KILL_GRACE_S)
        stopped = ended_by is not None and returncode is None  # torchpace stopped the tree after its grace
        if stopped:
            returncode = proc.returncode if proc.returncode is not None else -signal.SIGTERM
        wall_s = time.perf_counter() - start
        _log.info("trial process %d exited after %.1f s, start-up included: %s", proc.pid, wall_s,
                  "killed at its cap" if returncode is None else f"exit status {returncode}")
        if returncode is None:
            stderr_tail = all_ranks_stderr(result_path) + _tail(err_path)
            status, why = classify_timeout(said, dead)
            return TrialResult(status, error=f"no result after {timeout_s:.0f} s; the trial's process group was killed"
                               + (f": {why}" if why else ""), stderr_tail=stderr_tail, wall_time_s=wall_s)
        if ended_by in ("failed", "died"):
            failure = JobWatch(result_path).failure(spec, _tail(err_path), wall_s, returncode)
            if failure is not None and not result_path.exists():
                return failure
        return read_trial_result(spec, result_path, err_path, returncode, wall_s, stopped=stopped)


def wait_trial(proc, spec: TrialSpec, result_path: Path, timeout_s: float) -> tuple[int | None, str | None]:
    """Wait for the trial process: (its exit status, None) when it ends by itself. A script-mode trial's tree is
    also watched (`JobWatch`): once its result is written, or one of its ranks failed or died, the tree gets a
    grace to end by itself, then (None, what ended it) and the caller stops it.

    Raises:
        subprocess.TimeoutExpired: `timeout_s` passed first.
    """
    if not spec.command:
        return proc.wait(timeout=timeout_s), None
    watch, deadline = JobWatch(result_path), time.monotonic() + timeout_s
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic()))), None
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
        seen = watch.check()
        if seen is None:
            continue
        _log.info("trial process %d: %s; its tree gets a grace to end", proc.pid,
                  "its result is written" if seen == "result" else f"a rank {seen}")
        try:
            return proc.wait(timeout=END_GRACE_S if seen == "result" else FAILED_GRACE_S), seen
        except subprocess.TimeoutExpired:
            return None, seen


@contextlib.contextmanager
def trial_dir(workdir: Path | None = None) -> Iterator[Path]:
    """A trial's temporary folder, named after this process (see `remove_orphan_trial_dirs`), removed at the end."""
    with temporary_folder(f"{_TRIAL_DIR_PREFIX}{os.getpid()}-", workdir) as tmp:  # removed by an emergency stop too
        yield tmp


def trial_paths(folder: Path, spec: TrialSpec | None = None, log_path: Path | None = None) -> tuple[Path, Path, Path]:
    """(spec, result, output) paths of the trial in `folder`. The output is the child's stderr, and for a
    script-mode trial the script's whole output (stdout too, `child_stdout`): in `log_path` when given
    (its folder is made: torchpace's own, never through a symlink, `own_folder`), else in `folder`."""
    output = folder / "stderr.txt"
    if spec is not None and spec.command:
        output = Path(log_path) if log_path is not None else folder / "output.log"
        own_folder(output.parent)
    return folder / "spec.json", folder / "result.json", output


def open_trial_output(path: Path):
    """The trial's output file (`trial_paths`), opened new (`open_fresh`); one that cannot be made (a full disk,
    a read-only folder) is `OutputWriteFailed` naming it, torchpace's error before the trial starts."""
    with writing(path):
        return open_fresh(path)


def child_stdout(spec: TrialSpec, output_file):
    """Where the trial child's stdout goes: a script's into its output file with its stderr (what it prints
    is the user's to read); torchpace's own trial child has nothing to say there."""
    return output_file if spec.command else subprocess.DEVNULL


def plan_trial_child(spec: TrialSpec, host: HostFacts, base_env: Mapping[str, str], spec_path: Path, result_path: Path,
                     timeout_s: float) -> tuple[list[str], dict[str, str], int | None]:
    """(argv, env, soft RLIMIT_NOFILE or None) of the process that runs `spec`: the user's script with the
    hook in script mode, else `python -m torchpace.trial`.

    Raises:
        UsageError: the config needs a tool this host lacks.
    """
    if spec.command:  # script mode: the user's script, launched with the trial's config and the hook
        return plan_script_trial(spec, host, base_env, result_path, timeout_s)
    plan = plan_trial(spec.config, host, base_env, spec_path, result_path)
    return list(plan.argv), dict(plan.env), plan.nofile


def read_trial_result(spec: TrialSpec, result_path: Path, err_path: Path, returncode: int, wall_s: float,
                      stopped: bool = False) -> TrialResult:
    """The result of a trial process that ended with `returncode`: its result file, or its failure.

    Raises:
        OutputWriteFailed: it failed where the disk that holds its output log or its result is full: the
            disk's failure (exit 1, the space left), not the script's.
    """
    if returncode != 0 or not result_path.exists():
        check_disk_left([err_path, result_path], "the trial's output" if not spec.command else "the script's output log")
    if spec.command:
        return read_script_result(spec, result_path, returncode, _tail(err_path), wall_s, stopped)
    if returncode != 0 and nproc_of(spec.config) > 1:
        return read_rank_failure(result_path, _tail(err_path), returncode, wall_s)
    return _read_result(result_path, returncode, _tail(err_path), wall_s)


def dump_stacks(pid: int, stderr_paths: list[Path]) -> None:
    """Ask every trial process in `pid`'s tree (the trial, or its ranks under torchrun) to write its
    threads' stacks to its stderr, where a stuck trial was; return once they are written.

    Only at the cap, on a trial that is about to be killed: faulthandler reads other threads' frames
    while they run, which can crash a live process, so a trial that is still working never dumps.
    """
    try:
        tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return
    for process in tree:
        try:
            if "torchpace.trial" in process.cmdline():
                process.send_signal(STACK_DUMP_SIGNAL)
        except psutil.Error:
            continue
    sizes, settled_at, deadline = None, time.monotonic(), time.monotonic() + _DUMP_WAIT_S
    while time.monotonic() < deadline:
        now = [path.stat().st_size if path.exists() else 0 for path in stderr_paths]
        if now != sizes:
            sizes, settled_at = now, time.monotonic()
        elif time.monotonic() - settled_at >= _DUMP_SETTLED_S:
            return
        time.sleep(0.05)


def dead_children(pid: int) -> list[int]:
    """Descendants of `pid` that have exited but were not reaped (zombies): a worker whose death its
    parent never noticed."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    dead = []
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                dead.append(child.pid)
        except psutil.Error:
            continue  # gone meanwhile: reaped by its parent, so noticed
    return dead


def remove_orphan_trial_dirs(root: Path | None = None) -> list[Path]:
    """Remove the trial folders a killed tuner left behind (SIGKILL skips its clean-up) and return them.

    A trial folder is named after the process that runs the trial (`torchpace-trial-PID-...`); one
    whose process is no longer running belongs to nobody. Folders of running tuners are kept."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{_TRIAL_DIR_PREFIX}*-*"):
        owner = folder.name[len(_TRIAL_DIR_PREFIX):].partition("-")[0]
        if owner.isdigit() and not _is_running(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)  # another tuner may be removing it at the same time
            removed.append(folder)
    return removed


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        return True
    return True


def _tail(path: Path) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-_STDERR_TAIL_BYTES:].decode(errors="replace")


def _read_result(path: Path, returncode: int, stderr_tail: str, wall_s: float) -> TrialResult:
    if returncode == 0 and path.exists():
        data = json.loads(path.read_text())
        data.update(stderr_tail=stderr_tail, returncode=returncode)
        return TrialResult.from_dict(data)
    status = classify_exit(returncode, stderr_tail) if returncode else CRASH
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    return TrialResult(status, error=f"the trial process ended without a result ({how})", stderr_tail=stderr_tail,
                       returncode=returncode, wall_time_s=wall_s)
