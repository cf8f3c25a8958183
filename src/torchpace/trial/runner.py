"""Parent side of a trial: build the child's env and argv from the process-level knobs, run
`python -m torchpace.trial` (under torchrun for `nproc_per_node > 1`, see `ranks.py`) in its own
process group, enforce the timeout, and kill the whole group and every process it started
(DataLoader workers and torchrun's ranks, which sit in sessions of their own) on timeout, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

from torchpace.host import HostFacts
from torchpace.knobs import REGISTRY
from torchpace.knobs.distributed import nproc_of
from torchpace.trial.protocol import CRASH, TIMEOUT, TrialResult, TrialSpec, classify_exit
from torchpace.trial.ranks import all_ranks_stderr, child_argv, read_rank_failure

_STDERR_TAIL_BYTES = 4000
_KILL_GRACE_S = 3.0  # SIGTERM first, then SIGKILL after this


def plan_trial_env(config: Mapping[str, object], host: HostFacts, base_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv prefix, child env) for a trial: base env plus every knob's process-level settings."""
    env = dict(base_env)
    prefix: list[str] = []
    for name, knob in REGISTRY.items():
        value = config.get(name, knob.default)
        knob.child_env(value, host, env)
        prefix += knob.child_command_prefix(value, host)
    return prefix, env


def kill_process_group(proc: subprocess.Popen, grace_s: float = _KILL_GRACE_S) -> None:
    """SIGTERM the child's whole process group, then SIGKILL what is left after `grace_s`, and
    every descendant that left the group (torchrun starts each rank in a session of its own)."""
    descendants = _descendants(proc.pid)
    try:
        _signal_group(proc, grace_s)
    finally:
        _kill_all(descendants)


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(processes: list) -> None:
    import psutil

    for process in processes:
        try:
            process.kill()  # psutil checks the pid was not reused since it was listed
        except psutil.Error:
            pass


def _signal_group(proc: subprocess.Popen, grace_s: float) -> None:
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers (workers) that ignored SIGTERM
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def run_trial(spec: TrialSpec, host: HostFacts, timeout_s: float, base_env: Mapping[str, str] | None = None,
              workdir: Path | None = None) -> TrialResult:
    """Run one trial in a child process and return its result (never raises for the child's failures)."""
    base_env = os.environ if base_env is None else base_env
    prefix, env = plan_trial_env(spec.config, host, base_env)
    with tempfile.TemporaryDirectory(prefix="torchpace-trial-", dir=workdir) as tmp:
        spec_path, result_path, err_path = Path(tmp) / "spec.json", Path(tmp) / "result.json", Path(tmp) / "stderr.txt"
        spec.save(spec_path)
        argv = [*prefix, *child_argv(spec.config, spec_path, result_path)]
        start = time.perf_counter()
        with open(err_path, "wb") as err_file:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True,
                                    preexec_fn=die_with_parent)
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_process_group(proc)
                return TrialResult(TIMEOUT, error=f"no result after {timeout_s:.0f} s; the trial's process group was killed",
                                   stderr_tail=all_ranks_stderr(result_path) + _tail(err_path), wall_time_s=time.perf_counter() - start)
            except BaseException:  # Ctrl-C / SIGTERM of the parent: leave nothing behind
                kill_process_group(proc)
                raise
            finally:
                _reap_group(proc)
        wall_s = time.perf_counter() - start
        if returncode != 0 and nproc_of(spec.config) > 1:
            return read_rank_failure(result_path, _tail(err_path), returncode, wall_s)
        return _read_result(result_path, returncode, _tail(err_path), wall_s)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process if its parent dies (even by kill -9): the trial child
    before exec, and each torchrun rank of a multi-process trial.

    DataLoader workers notice their parent died and exit by themselves, so nothing is orphaned.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _reap_group(proc: subprocess.Popen) -> None:
    """Kill any process the trial left in its group (e.g. orphaned workers) after it exited."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already empty: nothing left behind


def _tail(path: Path) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-_STDERR_TAIL_BYTES:].decode(errors="replace")


def _read_result(path: Path, returncode: int, stderr_tail: str, wall_s: float) -> TrialResult:
    import json

    if returncode == 0 and path.exists():
        data = json.loads(path.read_text())
        data.update(stderr_tail=stderr_tail, returncode=returncode)
        return TrialResult.from_dict(data)
    status = classify_exit(returncode, stderr_tail) if returncode else CRASH
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    return TrialResult(status, error=f"the trial process ended without a result ({how})", stderr_tail=stderr_tail,
                       returncode=returncode, wall_time_s=wall_s)
