"""CSV and TensorBoard sinks, on real files."""

from __future__ import annotations

import csv
import sys

import pytest

from torchpace.errors import UsageError
from torchpace.monitor.samples import build_column_names, flatten_sample
from torchpace.monitor.sinks import CsvSink, TensorBoardSink, build_scalar_tag, format_csv_value, open_sinks


def test_csv_has_a_header_and_one_row_per_sample(tmp_path, make_sample):
    path = tmp_path / "run.csv"
    sink = CsvSink(path, build_column_names(n_cores=4, n_gpus=1))
    assert path.read_text().startswith("t_s,unix_time_s,interval_s,cpu_pct,")  # header before any sample
    for t in (1.0, 2.0, 3.0):
        sink.write(flatten_sample(make_sample(t_s=t, cpu_pressure_frac=None), started_unix_s=1000.0))
    sink.close()
    rows = list(csv.DictReader(path.open()))
    assert [r["t_s"] for r in rows] == ["1.0", "2.0", "3.0"] and rows[0]["unix_time_s"] == "1001.0"
    assert rows[0]["cpu_pressure_frac"] == "" and rows[0]["gpu0_mem_total_bytes"] == str(80 * 2**30)


def test_a_csv_at_a_planted_symlink_replaces_the_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "run.csv").symlink_to(victim)
    sink = CsvSink(tmp_path / "run.csv", ["t_s"])
    sink.close()
    assert victim.read_text() == "precious\n"
    assert not (tmp_path / "run.csv").is_symlink() and (tmp_path / "run.csv").read_text().startswith("t_s")


def test_csv_values_are_plain_numbers():
    assert [format_csv_value(v) for v in (None, 3, 0.123456789, 1e20, "a|b")] == ["", "3", "0.1235", "1e+20", "a|b"]


@pytest.mark.parametrize("where", ["missing-dir/run.csv", "."])
def test_unwritable_csv_is_a_usage_error(tmp_path, where):
    with pytest.raises(UsageError, match="cannot write --csv") as err:
        open_sinks(tmp_path / where, None, ["t_s"])
    assert err.value.exit_code == 2


def test_tensorboard_tags_group_by_source():
    assert build_scalar_tag("gpu0_util_pct") == "gpu0/util_pct"
    assert build_scalar_tag("tree_cpu_pct") == "tree/cpu_pct"
    assert build_scalar_tag("iowait_pct") == "host/iowait_pct"
    assert build_scalar_tag("cpu3_pct") is None and build_scalar_tag("t_s") is None


def test_tensorboard_missing_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now raises ImportError
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with pytest.raises(UsageError, match=r"pip install 'torchpace\[tensorboard\]'"):
        open_sinks(tmp_path / "a.csv", tmp_path / "tb", ["t_s"])


def test_tensorboard_writes_scalars(tmp_path, make_sample):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    for t in (1.0, 2.0):
        sink.write(flatten_sample(make_sample(t_s=t, tree_cpu_pct=100.0 * t), started_unix_s=1000.0))
    sink.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tree = events.Scalars("tree/cpu_pct")
    assert [(e.step, e.value, e.wall_time) for e in tree] == [(0, 100.0, 1001.0), (1, 200.0, 1002.0)]
    assert "gpu0/util_pct" in events.Tags()["scalars"]


# ---- a full disk ---------------------------------------------------------------------------------------


def test_a_csv_on_a_full_disk_is_one_error_naming_the_free_space_before_cmd_starts(full_disk, tmp_path, cli_run):
    from torchpace.files import OutputWriteFailed

    with pytest.raises(OutputWriteFailed) as failed:
        open_sinks(full_disk / "run.csv", None, build_column_names(n_cores=2, n_gpus=0))
    assert "no space left on device" in str(failed.value) and "free on its filesystem" in str(failed.value)
    assert not (full_disk / "run.csv").exists()
    started = tmp_path / "started"
    done = cli_run("monitor", "--csv", str(full_disk / "m.csv"), "--", sys.executable, "-c",
                   f"open({str(started)!r}, 'w')")
    errors = [line for line in done.stderr.splitlines() if line.startswith("torchpace: error:")]
    assert done.returncode == 1 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert str(full_disk / "m.csv") in errors[0] and "free on its filesystem" in errors[0]
    assert not started.exists()  # CMD never ran


def test_a_disk_that_fills_mid_run_ends_the_log_not_cmd_and_says_so(small_disk, make_sample):
    import io

    from rich.console import Console

    from _support import fill_disk
    from torchpace.monitor.live import PlainView
    from torchpace.monitor.run import _Supervisor
    from torchpace.monitor.symptoms import SymptomContext, SymptomTracker

    path = small_disk / "run.csv"
    sinks = open_sinks(path, None, build_column_names(n_cores=4, n_gpus=1))
    supervisor = _Supervisor(PlainView(Console(file=io.StringIO(), width=200)), sinks,
                             SymptomTracker(SymptomContext(4)), 1000.0)
    supervisor.handle(make_sample(t_s=1.0))
    fill_disk(small_disk)
    # rows fill what is left of the file's last block, then one cannot be written: no exception reaches the loop
    for t in range(2, 200):
        supervisor.handle(make_sample(t_s=float(t)))
        if not supervisor.sinks:
            break
    supervisor.handle(make_sample(t_s=500.0))  # the run goes on without the log
    assert supervisor.sinks == [] and supervisor.sample_count == t + 1
    [note] = supervisor.notes
    assert note.id == "monitor.sink_failed" and str(path) in note.evidence and "no space left on device" in note.evidence
    written = [row["t_s"] for row in csv.DictReader(path.open())]
    assert written[0] == "1.0" and "500.0" not in written
