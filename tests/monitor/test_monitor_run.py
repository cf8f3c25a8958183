"""`torchpace monitor` over real child processes: CSV contents, exit codes, signals, clean-up."""

from __future__ import annotations

import csv
import io
import json
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from _support import sigint_as_at_a_terminal, still_running
from torchpace.cli import main
from torchpace.errors import UsageError
from torchpace.monitor.live import LiveView, PlainView
from torchpace.monitor.run import (
    CommandNotFoundError,
    MonitorOptions,
    build_summary,
    check_options,
    resolve_command,
    run_monitor,
    split_output,
)

PY = sys.executable
MIB = 2**20

BURN_AND_WRITE = """
import json, multiprocessing, os, resource, sys, time

def burn(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    time.sleep(1.0)  # idle, still alive: the sampler (every 0.25 s, later on a loaded host) reads its last CPU time

if __name__ == "__main__":
    out = sys.argv[1]
    burners = [multiprocessing.Process(target=burn, args=(2.0,)) for _ in range(2)]
    for p in burners:
        p.start()
    with open(os.path.join(out, "data.bin"), "wb") as f:
        for _ in range(16):
            f.write(b"\\0" * (1 << 20))
        f.flush()
        os.fsync(f.fileno())
    for p in burners:
        p.join()
    time.sleep(0.6)  # a last sample or two of the quiet tree
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.path.join(out, "cpu.json"), "w") as f:
        json.dump({"children_cpu_s": usage.ru_utime + usage.ru_stime}, f)
"""


def _quiet_view() -> PlainView:
    return PlainView(Console(file=io.StringIO(), width=200))


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_two_busy_processes_and_a_file_write_show_in_the_csv(tmp_path):
    script = _script(tmp_path, "burn.py", BURN_AND_WRITE)
    options = MonitorOptions(command=(PY, str(script), str(tmp_path)), interval_s=0.25, csv_path=tmp_path / "m.csv")
    result = run_monitor(options, _quiet_view())
    assert result.exit_code == 0
    rows = [{k: float(v) for k, v in row.items() if v and k != "gpu0_throttle_reasons"}
            for row in csv.DictReader((tmp_path / "m.csv").open())]
    assert len(rows) == result.sample_count >= 6
    gaps = [b["t_s"] - a["t_s"] for a, b in zip(rows, rows[1:])]
    assert 0.2 <= statistics.median(gaps) <= 0.35  # rows at the interval
    assert max(r["tree_procs"] for r in rows) >= 3  # CMD and its two burners
    # The tree column integrates to the CPU the burners used (their own rusage), so both are counted:
    # counting only one would give about half.
    tree_cpu_s = sum(r["tree_cpu_pct"] / 100 * r["interval_s"] for r in rows)
    children_cpu_s = json.loads((tmp_path / "cpu.json").read_text())["children_cpu_s"]
    assert 0.7 * children_cpu_s <= tree_cpu_s <= 1.2 * children_cpu_s + 0.3
    tree_written = sum(r["tree_write_bytes_per_s"] * r["interval_s"] for r in rows)
    disk_written = sum(r["disk_write_bytes_per_s"] * r["interval_s"] for r in rows)
    assert tree_written >= 15 * MIB and disk_written >= 15 * MIB  # 16 MiB written and fsync'ed
    assert 0 < result.sampler_cpu_s < result.sampler_wall_s
    summary = build_summary(result)
    assert summary["sampler"]["core_pct"] > 0 and any(m["name"] == "tree_cpu_pct" for m in summary["metrics"])


@pytest.mark.parametrize("code, expected", [
    ("import sys; sys.exit(3)", 3),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + 9),
])
def test_exit_code_is_cmds(code, expected):
    result = run_monitor(MonitorOptions(command=(PY, "-c", code), interval_s=0.1), _quiet_view())
    assert result.exit_code == expected


LEAVES_PROCESSES = """
import json, os, signal, subprocess, sys, time
sleeper = subprocess.Popen(["sleep", "60"])  # in CMD's process group
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE)
stubborn.stdout.readline()  # its SIGTERM handler is in place
escaped = subprocess.Popen(["sleep", "60"], start_new_session=True)  # left CMD's process group
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump([os.getpid(), sleeper.pid, stubborn.pid, escaped.pid], f)
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def _wait_for(path: Path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _wait_for_tree(csv_path: Path, procs: int, timeout_s: float = 30.0) -> None:
    """Until a row of the monitor's CSV counts `procs` processes in CMD's tree (however loaded the host)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = list(csv.DictReader(csv_path.open())) if csv_path.exists() else []
        if any(int(row["tree_procs"]) >= procs for row in rows if row.get("tree_procs")):
            return
        assert time.monotonic() < deadline, f"the monitor never saw {procs} processes in the tree: {rows[-1:]}"
        time.sleep(0.05)


def test_sigterm_is_forwarded_and_nothing_is_left_running(tmp_path):
    pids_file = tmp_path / "pids.json"
    script = _script(tmp_path, "leave.py", LEAVES_PROCESSES)
    csv_path = tmp_path / "m.csv"
    monitor = subprocess.Popen(
        [PY, "-m", "torchpace", "monitor", "--interval", "0.1", "--json", "--csv", str(csv_path), "--", PY, str(script),
         str(pids_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(pids_file)
        _wait_for_tree(csv_path, procs=4)  # the sampler has seen the whole tree: CMD, sleeper, stubborn, escaped
        monitor.send_signal(signal.SIGTERM)
        out, err = monitor.communicate(timeout=30)
    finally:
        monitor.kill()
    pids = json.loads(pids_file.read_text())
    assert monitor.returncode == 128 + signal.SIGTERM, err
    summary = json.loads(out)
    assert summary["exit_code"] == 143 and summary["signals_forwarded"] == ["SIGTERM"]
    assert summary["leftover_processes_stopped"] >= 2  # the stubborn one and the escaped one
    assert still_running(pids, timeout_s=0) == []


def test_ctrl_c_is_forwarded(tmp_path):
    monitor = subprocess.Popen(
        [PY, "-m", "torchpace", "monitor", "--interval", "0.1", "--json", "--", PY, "-c",
         "import time; print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_at_a_terminal)
    try:
        assert monitor.stdout.readline().strip() == "up"  # CMD is running (its stdout is ours: not live)
        monitor.send_signal(signal.SIGINT)
        out, err = monitor.communicate(timeout=30)
    finally:
        monitor.kill()
    assert monitor.returncode == 128 + signal.SIGINT, err  # Python dies of SIGINT after KeyboardInterrupt
    assert json.loads(out)["signals_forwarded"] == ["SIGINT"]


def test_missing_command_exits_127_with_a_clear_message(capsys):
    assert main(["monitor", "--no-live", "--", "no-such-command-torchpace"]) == 127
    assert "command not found: 'no-such-command-torchpace' is not on PATH" in capsys.readouterr().err
    with pytest.raises(CommandNotFoundError):
        resolve_command(["./no/such/file"])


@pytest.mark.parametrize("interval", ["0", "-1", "0.000001", "nan", "inf", "3601", "1e300"])
def test_interval_must_be_between_the_shortest_and_the_longest_sample(capsys, interval, tmp_path):
    marker = tmp_path / "started"
    assert main(["monitor", "--interval", interval, "--", PY, "-c", f"open({str(marker)!r}, 'w')"]) == 2
    err = capsys.readouterr().err
    assert "--interval" in err and "0.1" in err and "3600" in err and not marker.exists()
    with pytest.raises(UsageError, match="from 0.1 to 3600"):  # the library's check says the same
        check_options(MonitorOptions(command=(PY,), interval_s=float(interval)))


def test_unwritable_csv_exits_2_before_cmd_starts(tmp_path, capsys):
    marker = tmp_path / "started"
    code = main(["monitor", "--csv", str(tmp_path / "no-dir" / "m.csv"), "--",
                 PY, "-c", f"open({str(marker)!r}, 'w')"])
    assert code == 2 and "--csv" in (err := capsys.readouterr().err) and "cannot be written" in err
    assert not marker.exists()


def test_json_summary_from_the_cli(capsys):
    assert main(["monitor", "--interval", "0.1", "--json", "--", PY, "-c", "import time; time.sleep(0.5)"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["exit_code"] == 0 and summary["samples"] >= 3 and summary["interval_s"] == 0.1
    assert summary["sampler"]["cpu_s"] >= 0 and summary["alerts"] == []
    assert {n["id"] for n in summary["notes"]} <= {"monitor.gpu_unavailable"}


def test_live_view_shows_cmds_output_and_progress(tmp_path):
    out = io.StringIO()
    view = LiveView(Console(file=out, force_terminal=True, width=120), "t", usable_cores=2)
    code = "import sys, time; print('hello from CMD'); sys.stderr.write('step 1\\rstep 2\\r'); time.sleep(0.4)"
    options = MonitorOptions(command=(PY, "-c", code), interval_s=0.1, capture_output=(True, True))
    assert run_monitor(options, view).exit_code == 0
    assert "hello from CMD" in out.getvalue() and "step 2" in out.getvalue()


def test_split_output_separates_lines_from_progress_redraws():
    pieces, rest = split_output(b"one\r\ntwo\nbar 10%\rbar 20%\rtail\r")
    assert pieces == [("one", False), ("two", False), ("bar 10%", True), ("bar 20%", True)]
    assert rest == b"tail\r"


def test_help_does_not_import_torch():
    code = ("import sys; from torchpace.cli import main; code = main(['monitor', '--help']); "
            "assert 'torch' not in sys.modules and 'psutil' not in sys.modules, 'heavy import'; sys.exit(code)")
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--interval" in done.stdout and "whole process group" in " ".join(done.stdout.split())
