"""`torchpace report` and `torchpace tune --report` end to end: exit codes, messages, files written."""

from __future__ import annotations

import subprocess
import sys

from _support import fixture_workload
from torchpace.cli import main


def test_help_imports_neither_torch_nor_matplotlib():
    code = ("import sys\nfrom torchpace.cli import main\nrc = main(['report', '--help'])\n"
            "print('HEAVY', sorted(m for m in ('torch', 'matplotlib', 'optuna') if m in sys.modules), rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "STUDY_OR_RESULT" in out.stdout and "--no-doctor" in out.stdout
    assert "HEAVY [] 0" in out.stdout


def test_a_file_that_is_not_a_study_or_result_exits_2_naming_what_was_expected(tmp_path, capsys):
    source = tmp_path / "notes.txt"
    source.write_text("hello")
    out = tmp_path / "r.html"
    assert main(["report", str(source), "-o", str(out), "--no-doctor"]) == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and "torchpace study" in err and "torchpace.bench" in err and "torchpace.profile" in err
    assert not out.exists()


def test_an_unwritable_output_exits_2_before_the_input_is_read(tmp_path, capsys):
    rc = main(["report", str(tmp_path / "missing.db"), "-o", str(tmp_path / "no-dir" / "r.html")])
    err = capsys.readouterr().err
    assert rc == 2 and "--out" in err and "cannot be written" in err and "missing.db" not in err


def test_the_report_never_overwrites_its_input(tuned_study, tmp_path, capsys):
    db = tmp_path / "s.db"
    db.write_bytes(tuned_study.db.read_bytes())
    assert main(["report", str(db), "-o", str(db)]) == 2
    assert "is the input" in capsys.readouterr().err
    assert db.read_bytes() == tuned_study.db.read_bytes()


def test_report_of_a_study_writes_the_file(tuned_study, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(tuned_study.db), "-o", str(out), "--no-doctor", "--study", tuned_study.name]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert "<title>torchpace tune report: raises_with_two_workers</title>" in out.read_text()


def test_storage_url_and_study_name_select_the_study(tuned_study, tmp_path):
    out = tmp_path / "r.html"
    assert main(["report", "--storage", f"sqlite:///{tuned_study.db}", "--study", tuned_study.name, "-o", str(out),
                 "--no-doctor"]) == 0
    assert "report-tiny" in out.read_text()


def test_tune_report_to_an_unwritable_path_exits_2_before_tuning(tmp_path, capsys):
    db = tmp_path / "s.db"
    rc = main(["tune", fixture_workload("tiny_mlp"), "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "t.toml"),
               "--report", str(tmp_path / "no-dir" / "r.html")])
    assert rc == 2 and "--report" in capsys.readouterr().err
    assert not db.exists() and not (tmp_path / "t.toml").exists()


def test_tune_report_writes_the_report_and_keeps_json_clean_and_both_reports_show_the_crash(tuned_study, tmp_path):
    """The session's real tune ran with --report --json; its data.num_workers=2 trial crashed."""
    assert f"wrote report {tuned_study.report}" in tuned_study.stderr  # stderr: --json's stdout parsed as JSON
    assert any(t["status"] == "crash" for t in tuned_study.outcome["trials"])
    stored = tmp_path / "stored.html"
    assert main(["report", str(tuned_study.db), "-o", str(stored), "--no-doctor"]) == 0
    for html in (tuned_study.report.read_text(), stored.read_text()):
        assert "<strong>crash</strong>" in html and "DataLoader worker" in html and 'data-chart="trials"' in html


def test_with_no_argument_the_study_tune_wrote_here_is_reported(tuned_study, tmp_path, monkeypatch, capsys):
    (tmp_path / ".torchpace").mkdir()
    (tmp_path / ".torchpace" / "studies.db").write_bytes(tuned_study.db.read_bytes())
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--no-doctor", "-o", "r.html"]) == 0, capsys.readouterr().err
    assert (tmp_path / "r.html").stat().st_size > 0
    assert main(["report", "--no-doctor", "-o", ".torchpace/studies.db"]) == 2
    assert "is the input" in capsys.readouterr().err
