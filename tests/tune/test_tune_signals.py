"""SIGTERM to a real `torchpace tune` subprocess behaves as Ctrl-C: the running trial is stopped and
marked, the best config so far is written, the exit status is 143, and no trial folder is left."""

import json
import os
import signal
import subprocess
import sys
import time

import optuna

from _support import fixture_workload


def _finished(tmp_path) -> int:
    try:
        study = optuna.load_study(study_name="torchpace-tiny_mlp", storage=f"sqlite:///{tmp_path / 's.db'}")
    except KeyError:
        return 0
    return sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))


def test_sigterm_mid_trial_writes_the_best_so_far_marks_the_trial_and_exits_143(tmp_path):
    trial_root = tmp_path / "tmp"
    trial_root.mkdir()
    argv = [sys.executable, "-m", "torchpace", "tune", fixture_workload("tiny_mlp"), "--storage",
            f"sqlite:///{tmp_path / 's.db'}", "--out", str(tmp_path / "torchpace.toml"), "--trial-time", "1",
            "--guard-steps", "6", "--knob", "data.num_workers", "--budget", "10m", "--json"]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=dict(os.environ, TMPDIR=str(trial_root)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:  # the baseline done, the next trial running
        if _finished(tmp_path) >= 1 and list(trial_root.glob("torchpace-trial-*")):
            break
        time.sleep(0.3)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "terminated (SIGTERM): the best config so far was written" in err
    assert (tmp_path / "torchpace.toml").exists()
    stopped = [t for t in json.loads(out)["trials"] if t["status"] == "interrupted"]
    assert len(stopped) == 1 and "`--resume` runs it again" in stopped[0]["error"]
    assert list(trial_root.glob("torchpace-trial-*")) == []
