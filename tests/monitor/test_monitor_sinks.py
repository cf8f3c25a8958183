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
