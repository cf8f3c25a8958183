"""Every file torchpace writes goes through one atomic writer (`torchpace.files`): a full disk is exit 1
with one line naming the path and the free space, the figures are still printed, and no temporary
file is left — on a real full filesystem, for every verb that writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torchpace.files import OutputWriteFailed, atomic_output, format_bytes, write_atomic

from _support import fixture_workload, temp_leftovers


def test_an_atomic_write_replaces_the_file_whole_or_not_at_all(tmp_path):
    path = write_atomic(tmp_path / "a.json", '{"a": 1}')
    assert path.read_text() == '{"a": 1}'
    with pytest.raises(RuntimeError):
        with atomic_output(path, "w") as stream:
            stream.write('{"a": 2')
            raise RuntimeError("the writer failed half-way")
    assert path.read_text() == '{"a": 1}' and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_write_that_cannot_happen_is_one_error_naming_the_path(tmp_path):
    with pytest.raises(OutputWriteFailed, match=r"cannot write '.*no-such-folder/a.json': no such file or directory"):
        write_atomic(tmp_path / "no-such-folder" / "a.json", "x")


def test_text_written_to_a_file_never_holds_a_secret(tmp_path):
    path = write_atomic(tmp_path / "t.toml", 'storage = "postgresql://u:hunter22@db/s"\n')
    assert "hunter22" not in path.read_text() and "u:***@db" in path.read_text()


def test_byte_counts_read_as_people_write_them():
    assert [format_bytes(n) for n in (0, 1023, 4096, 5 << 20, 3 << 30)] == ["0 bytes", "1023 bytes", "4.0 KiB", "5.0 MiB",
                                                                             "3.0 GiB"]


def test_a_full_disk_is_one_error_naming_path_and_free_space(full_disk):
    target = full_disk / "result.json"
    with pytest.raises(OutputWriteFailed) as failed:
        write_atomic(target, json.dumps({"samples_per_s": 1.0, "pad": "x" * 100_000}))
    message = str(failed.value)
    assert str(target) in message and "no space left on device" in message and "free on its filesystem" in message
    assert not target.exists() and temp_leftovers(full_disk) == []


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("torchpace: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


def _folder(tmp_path):
    from PIL import Image

    for label in range(2):
        (tmp_path / "images" / f"c{label}").mkdir(parents=True)
        for index in range(3):
            Image.new("RGB", (8, 8), (label * 100, index * 40, 0)).save(tmp_path / "images" / f"c{label}" / f"{index}.jpg")
    return tmp_path / "images"


# verb -> (argv with OUT for the output on the full disk, what stdout must still show)
_WRITERS = {
    "bench --out": (["bench", fixture_workload("tiny_mlp"), "--max-time", "2", "--json", "--out", "OUT/b.json"], "samples_per_s"),
    "profile --trace": (["profile", fixture_workload("tiny_mlp"), "--steps", "1", "--python-steps", "0", "--json",
                         "--trace", "OUT/t.json.gz"], "verdict"),
    "tune --out": (["tune", fixture_workload("tiny_mlp"), "--max-trials", "1", "--trial-time", "1", "--guard-steps", "0",
                    "--knob", "data.num_workers", "--json", "--storage", "sqlite:///STUDY", "--out", "OUT/t.toml"], "trials"),
    "shard --out": (["shard", "IMAGES", "--out", "OUT/shards"], ""),
    "bench-data --out": (["bench-data", "IMAGES", "--max-time", "0.2", "--shards", "none", "--cold", "none",
                          "--num-workers", "0", "--json", "--out", "OUT/d.json"], "decode_images"),
    "compare --out": (["compare", fixture_workload("tiny_mlp"), "--set", "threads.intra_op=1", "--max-time", "2", "--json",
                       "--out", "OUT/c.json"], "verdict"),
}


@pytest.mark.parametrize("verb", sorted(_WRITERS))
def test_every_writer_on_a_full_disk_exits_1_with_one_line_keeping_the_figures(verb, full_disk, tmp_path, cli_run,
                                                                              short_tmpdir):
    argv, shown = _WRITERS[verb]
    images = _folder(tmp_path) if verb.startswith(("shard", "bench-data")) else None
    argv = [a.replace("OUT", str(full_disk)).replace("STUDY", str(tmp_path / "s.db")).replace("IMAGES", str(images))
            for a in argv]
    done = cli_run(*argv, env_extra={"TMPDIR": str(short_tmpdir)}, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_error_line(done.stderr)
    assert str(full_disk) in line and "no space left on device" in line and "free on its filesystem" in line, line
    assert shown in done.stdout  # the figures were printed before the error
    assert temp_leftovers(full_disk) == [] and temp_leftovers(short_tmpdir) == []


def test_the_report_of_a_result_on_a_full_disk_is_one_line(full_disk, tmp_path, cli_run):
    result = tmp_path / "b.json"
    done = cli_run("bench", fixture_workload("tiny_mlp"), "--max-time", "2", "--out", str(result))
    assert done.returncode == 0, done.stderr[-3000:]
    done = cli_run("report", str(result), "-o", str(full_disk / "r.html"))
    assert done.returncode == 1 and str(full_disk / "r.html") in _one_error_line(done.stderr)
    assert temp_leftovers(full_disk) == []


def test_the_writers_share_one_helper():
    # every module that writes a file torchpace is asked for goes through torchpace.files
    import torchpace

    root = os.path.dirname(torchpace.__file__)
    hand_written = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py") and name != "files.py":
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                if ".tmp\"" in text or ".tmp'" in text or ".replace(path)" in text or "os.replace(" in text:
                    hand_written.append(os.path.relpath(os.path.join(folder, name), root))
    assert hand_written == [], f"atomic writes by hand (use torchpace.files): {hand_written}"


# ---- a folder prepared by someone else: symlinks, hard links and modes ---------------------------------

def _victim(tmp_path):
    victim = tmp_path / "elsewhere" / "victim.txt"
    victim.parent.mkdir()
    victim.write_text("precious\n")
    return victim


def test_a_symlink_planted_at_every_temporary_name_is_never_followed(tmp_path):
    out, victim = tmp_path / "out", _victim(tmp_path)
    out.mkdir()
    for pid in range(os.getpid() - 20, os.getpid() + 20):  # every name the old writer could pick
        (out / f".r.json.tmp-{pid}").unlink(missing_ok=True)
        (out / f".r.json.tmp-{pid}").symlink_to(victim)
    write_atomic(out / "r.json", '{"a": 1}')
    assert victim.read_text() == "precious\n"
    assert (out / "r.json").is_file() and not (out / "r.json").is_symlink()
    assert (out / "r.json").read_text() == '{"a": 1}'


def test_an_output_that_is_a_symlink_is_replaced_never_written_through(tmp_path):
    out, victim = tmp_path / "out", _victim(tmp_path)
    out.mkdir()
    (out / "r.json").symlink_to(victim)
    write_atomic(out / "r.json", "new")
    assert victim.read_text() == "precious\n" and not (out / "r.json").is_symlink()
    assert (out / "r.json").read_text() == "new"


def test_a_rewrite_keeps_the_mode_of_the_file_it_replaces_and_a_new_file_follows_the_umask(tmp_path):
    private = tmp_path / "private.json"
    private.write_text("old")
    private.chmod(0o600)
    write_atomic(private, "new")
    assert private.stat().st_mode & 0o777 == 0o600
    shared = tmp_path / "shared.json"
    shared.write_text("old")
    shared.chmod(0o664)
    write_atomic(shared, "new")
    assert shared.stat().st_mode & 0o777 == 0o664
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "fresh.json", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "fresh.json").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("planted", ["symlink", "hard link", "fifo"])
def test_a_log_opened_fresh_never_writes_through_what_was_planted_at_its_name(tmp_path, planted):
    from torchpace.files import open_fresh

    victim = _victim(tmp_path)
    log = tmp_path / "trial-0.log"
    if planted == "symlink":
        log.symlink_to(victim)
    elif planted == "hard link":
        os.link(victim, log)
    else:
        os.mkfifo(log)
    with open_fresh(log) as stream:
        stream.write(b"the script's output\n")
    assert victim.read_text() == "precious\n"
    assert log.is_file() and not log.is_symlink() and log.read_bytes() == b"the script's output\n"


def test_a_log_rewritten_keeps_its_mode(tmp_path):
    from torchpace.files import open_fresh

    log = tmp_path / "trial-0.log"
    log.write_text("before")
    log.chmod(0o600)
    with open_fresh(log, "w", encoding="utf-8") as stream:
        stream.write("after")
    assert log.read_text() == "after" and log.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("link", [".torchpace", ".torchpace/logs", ".torchpace/logs/study"])
def test_torchpace_s_own_folder_is_never_a_symlink_to_somewhere_else(tmp_path, monkeypatch, link):
    from torchpace.errors import UsageError
    from torchpace.files import own_folder

    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(link).parent.mkdir(parents=True, exist_ok=True)
    Path(link).symlink_to(elsewhere)
    with pytest.raises(UsageError, match=rf"'{link}' is a symlink .*elsewhere"):
        own_folder(Path(".torchpace/logs/study"))
    assert list(elsewhere.iterdir()) == []
    assert own_folder(Path("other/logs")) == Path("other/logs") and Path("other/logs").is_dir()


def test_a_tune_never_follows_a_log_planted_in_the_project_folder(cli_run, tmp_path):
    victim = _victim(tmp_path)
    script = tmp_path / "job.py"
    script.write_text("import torch\nprint('script output')\nm = torch.nn.Linear(4, 1)\n"
                      "opt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
                      "for _ in range(100000):\n    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()\n")
    logs = tmp_path / ".torchpace" / "logs" / "torchpace-job.py"
    logs.mkdir(parents=True)
    (logs / "trial-0.log").symlink_to(victim)
    done = cli_run("tune", "--max-trials", "1", "--trial-time", "1", "--guard-steps", "0", "--json", "--",
                   "python", "job.py")
    assert done.returncode == 0, done.stderr[-3000:]
    assert victim.read_text() == "precious\n"
    assert not (logs / "trial-0.log").is_symlink() and "script output" in (logs / "trial-0.log").read_text()



# ---- a working folder or temporary folder that cannot take torchpace's own files ---------------------

_JOB = ("import torch\nprint('script output')\nm = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "for _ in range(100000):\n    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()\n")
_SCRIPT_VERBS = {
    "bench": ["bench", "--max-time", "2", "--", "python", "job.py"],
    "profile": ["profile", "--steps", "2", "--python-steps", "0", "--trace", "TRACE", "--", "python", "job.py"],
    "tune": ["tune", "--max-trials", "1", "--trial-time", "1", "--guard-steps", "0", "--out", "OUT", "--", "python",
             "job.py"],
}


def _not_the_scripts_fault(done) -> str:
    line = _one_error_line(done.stderr)
    assert "YOUR" not in done.stderr and "the script's own failure" not in done.stderr, done.stderr[-3000:]
    return line


@pytest.mark.parametrize("verb", sorted(_SCRIPT_VERBS))
def test_a_read_only_working_folder_is_torchpace_s_error_exit_2_before_the_script_runs(verb, read_only_folder, tmp_path,
                                                                                       cli_run):
    folder = read_only_folder({"job.py": _JOB + "open('/dev/null', 'w')\n"})
    argv = [a.replace("TRACE", str(tmp_path / "t.json.gz")).replace("OUT", str(tmp_path / "t.toml"))
            for a in _SCRIPT_VERBS[verb]]
    done = cli_run(*argv, cwd=folder)
    assert done.returncode == 2, done.stderr[-3000:]
    line = _not_the_scripts_fault(done)
    assert ".torchpace" in line and "writ" in line, line
    assert "script output" not in done.stdout + done.stderr


@pytest.mark.parametrize("verb", sorted(_SCRIPT_VERBS))
def test_a_full_working_folder_is_torchpace_s_error_never_the_script_s(verb, small_disk, tmp_path, cli_run):
    from _support import fill_disk

    (small_disk / "job.py").write_text(_JOB)
    fill_disk(small_disk)
    argv = [a.replace("TRACE", str(tmp_path / "t.json.gz")).replace("OUT", str(tmp_path / "t.toml"))
            for a in _SCRIPT_VERBS[verb]]
    done = cli_run(*argv, cwd=small_disk)
    assert done.returncode == 1, done.stderr[-3000:]
    line = _not_the_scripts_fault(done)
    assert "no space left on device" in line and (str(small_disk) in line or ".torchpace" in line), line
