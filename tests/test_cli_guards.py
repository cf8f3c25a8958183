"""Bad input across every verb, in real subprocesses: no output may destroy an input, every float
option is finite, every knob value fits this host; each refusal is exit 2 before anything runs."""

import os
import shutil
from pathlib import Path

import pytest

from _support import FIXTURES

WORKLOAD_SRC = FIXTURES / "workloads.py"


@pytest.fixture
def workload_copy(tmp_path):
    """A copy of the fixture workloads in tmp_path, a symlink and a hard link to it; returns the copy."""
    copy = tmp_path / "w.py"
    shutil.copy(WORKLOAD_SRC, copy)
    (tmp_path / "link.py").symlink_to(copy)
    os.link(copy, tmp_path / "hard.py")
    return copy


@pytest.mark.parametrize("args, message", [
    (["bench", "w.py:tiny_mlp", "--out", "w.py"], "--out 'w.py' is the workload file"),
    (["bench", "w.py:tiny_mlp", "--out", "link.py"], "--out 'link.py' is the workload file 'w.py'"),
    (["bench", "w.py:tiny_mlp", "--out", "hard.py"], "--out 'hard.py' is the workload file 'w.py'"),
    (["profile", "w.py:tiny_mlp", "--trace", "w.py"], "--trace 'w.py' is the workload file"),
    (["tune", "w.py:tiny_mlp", "--out", "hard.py"], "--out 'hard.py' is the workload file"),
    (["tune", "w.py:tiny_mlp", "--export", "link.py"], "--export 'link.py' is the workload file"),
    (["tune", "tabular", "--out", "a.toml", "--report", "./a.toml"], "--out and --report are both"),
    (["monitor", "--csv", "w.py", "--", "python", "w.py"], "--csv 'w.py' is the script 'w.py'"),
    (["monitor", "--tensorboard", "hard.py", "--", "python", "--x=w.py"], "is a file the command names"),
    (["report", "w.py", "--out", "link.py"], "--out 'link.py' is the input 'w.py'"),
    (["bench-data", ".", "--out", "sub/r.json"], "inside the folder measured"),
    (["bench", "--out", "hard.py", "--", "python", "w.py"], "--out 'hard.py' is the script 'w.py'"),
    (["tune", "--out", "link.py", "--", "python", "job.py", "--data=w.py"], "is a file the command names 'w.py'"),
    (["profile", "--trace", "w.py", "--", "python", "w.py"], "--trace 'w.py' is the script"),
])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(cli_run, workload_copy, tmp_path, args, message):
    (tmp_path / "sub").mkdir()
    (tmp_path / "job.py").write_text("")  # a script after `--` must exist (else that is the exit 2)
    before = workload_copy.read_bytes()
    done = cli_run(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "choose another path" in done.stderr or "choose a path outside" in done.stderr
    assert workload_copy.read_bytes() == before


def test_tune_out_naming_its_own_study_is_refused_and_the_study_kept(cli_run, tmp_path):
    study = tmp_path / "s.db"
    study.write_bytes(b"SQLite format 3\x00 planted")
    for storage, out in ((None, ".torchpace/studies.db"), (f"sqlite:///{study}", str(study))):
        if storage is None:
            (tmp_path / ".torchpace").mkdir()
            shutil.copy(study, tmp_path / out)
        done = cli_run("tune", "tabular", "--out", out, *(["--storage", storage] if storage else []))
        assert done.returncode == 2 and "is the study storage" in done.stderr, done.stderr
        assert (tmp_path / out).read_bytes() == study.read_bytes()


def test_monitor_csv_naming_the_script_does_not_run_or_truncate_it(cli_run, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("open('ran', 'w').write('yes')\n")
    done = cli_run("monitor", "--no-live", "--csv", "job.py", "--", "python", "job.py")
    assert done.returncode == 2, done.stderr
    assert script.read_text().startswith("open(") and not (tmp_path / "ran").exists()


@pytest.mark.parametrize("args", [
    ["bench", "--max-time", "nan"], ["bench", "--max-time", "inf"], ["bench", "--max-time", "-1"],
    ["tune", "--trial-time", "nan"], ["tune", "--trial-time", "inf"], ["tune", "--min-top1", "nan"],
    ["tune", "--accuracy-rtol", "inf"], ["bench-data", ".", "--max-time", "nan"],
    ["monitor", "--interval", "nan", "--", "true"], ["monitor", "--interval", "inf", "--", "true"],
])
def test_every_float_option_is_finite(cli_run, args):
    done = cli_run(*args)
    assert done.returncode == 2, done.stderr
    assert "not a finite number" in done.stderr or "x>0" in done.stderr or "is not in the range" in done.stderr


@pytest.mark.parametrize("name, field", [
    ("model_not_a_module", "Workload.model"), ("dataset_none", "Workload.dataset"),
    ("dataset_smaller_than_a_batch", "Workload.dataset"), ("batch_size_zero", "Workload.batch_size"),
])
def test_a_workload_of_the_wrong_shape_exits_2_naming_the_field(cli_run, name, field):
    done = cli_run("bench", f"{WORKLOAD_SRC}:{name}", "--max-time", "1")
    assert done.returncode == 2, done.stderr
    assert field in done.stderr and "YOUR code" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("name, said", [("sys_exit_in_getitem", "sys.exit(3)"), ("os_exit_in_getitem", "os._exit(3)"),
                                        ("nan_loss", "the loss was nan")])
def test_a_workload_that_exits_or_diverges_in_bench_exits_1_with_a_message(cli_run, name, said):
    done = cli_run("bench", f"{WORKLOAD_SRC}:{name}", "--max-time", "3")
    assert done.returncode == 1, done.stderr
    assert said in done.stderr


@pytest.mark.parametrize("args, message", [
    (["bench", "--set", "data.num_workers=9999"], "'data.num_workers' = 9999 does not apply here: 9999 is more than "
                                                  "this host allows: at most"),
    (["bench", "--set", "threads.intra_op=4096"], "'threads.intra_op' = 4096 does not apply here"),
    (["profile", "--set", "data.num_workers=9999"], "9999 is more than this host allows"),
    (["bench-data", ".", "--num-workers", "9999"], "--num-workers 9999: 9999 is more than this host allows"),
    (["launch", "--dry-run", "--nproc-per-node", "4096", "--", "job.py"], "--nproc-per-node 4096: 4096 is more than"),
    (["launch", "--dry-run", "--omp-threads", "4096", "--", "job.py"], "--omp-threads 4096: 4096 is more than"),
    (["launch", "--dry-run", "--config", "c.toml", "--", "job.py"], "'precision.amp' = 'fp16' does not apply here"),
    (["launch", "--dry-run", "--config", "w.toml", "--", "job.py"], "'data.num_workers' = 9999 does not apply here"),
])
def test_knob_values_beyond_the_host_exit_2_naming_knob_value_and_limit(cli_run, tmp_path, args, message):
    import torch

    if torch.cuda.is_available() and "c.toml" in args:
        pytest.skip("fp16 applies on a CUDA host")
    (tmp_path / "job.py").write_text("print('ran')\n")
    (tmp_path / "c.toml").write_text('schema_version = 1\n[knobs]\n"precision.amp" = "fp16"\n')
    (tmp_path / "w.toml").write_text('schema_version = 1\n[knobs]\n"data.num_workers" = 9999\n')
    done = cli_run(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "ran" not in done.stdout


def test_config_that_is_not_utf8_and_a_bogus_device_exit_2(cli_run, tmp_path):
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfeschema_version = 1\n")
    done = cli_run("bench", "--config", "bad.toml")
    assert done.returncode == 2 and "is not UTF-8 text" in done.stderr, done.stderr
    done = cli_run("bench", "--device", "bogus")
    assert done.returncode == 2 and "'bogus' is not a torch device; valid: cpu, cuda" in done.stderr, done.stderr


def test_a_bench_json_missing_fields_and_a_missing_shard_folder_exit_2(cli_run, tmp_path):
    (tmp_path / "b.json").write_text('{"kind": "torchpace.bench", "schema_version": 1, "workload": "x"}')
    done = cli_run("report", "b.json", "--no-doctor")
    assert done.returncode == 2 and "is a bench result without the field(s) config, device" in done.stderr, done.stderr
    images = tmp_path / "imgs" / "a"
    images.mkdir(parents=True)
    from PIL import Image

    for i in range(2):
        Image.new("RGB", (8, 8)).save(images / f"{i}.jpg")
    done = cli_run("bench-data", "imgs", "--shards", str(tmp_path / "missing"), "--max-time", "0.2")
    assert done.returncode == 2 and "is not a shard folder (no manifest.json)" in done.stderr, done.stderr


def test_the_workload_file_of_a_module_spec_is_found_without_running_the_module(tmp_path, monkeypatch):
    from torchpace.cli._common import workload_file

    package = tmp_path / "pkgx" / "sub"
    package.mkdir(parents=True)
    (tmp_path / "pkgx" / "__init__.py").write_text("raise RuntimeError('planted: importing pkgx runs this')\n")
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert workload_file("pkgx.sub.mod:build") == package / "mod.py"
    assert workload_file("pkgx:build") == tmp_path / "pkgx" / "__init__.py"
    assert workload_file("tabular") is None and workload_file("no_such_pkg.mod:f") is None
    assert workload_file("w.py:build") == Path("w.py")


@pytest.fixture
def readonly_dir(tmp_path):
    """A folder no one may write in: mode 0555, or for root (whom modes do not stop) the immutable flag."""
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
        pytest.skip("root, and this filesystem cannot mark a folder immutable (chattr +i)")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.parametrize("args", [["shard", "imgs", "--out", "ro/shards"], ["shard", "imgs", "--out", "ro"],
                                  ["bench", "--out", "ro/r.json"], ["tune", "--out", "ro/t.toml"],
                                  ["monitor", "--tensorboard", "ro/tb", "--", "true"]])
def test_an_output_in_a_read_only_folder_exits_2_before_anything_runs(cli_run, readonly_dir, args):
    done = cli_run(*args)
    assert done.returncode == 2, done.stderr
    assert "cannot be written (is the folder there, and writable?)" in done.stderr
    assert list(readonly_dir.iterdir()) == []


@pytest.fixture
def project(tmp_path):
    """A project as people lay one out: a script with a sibling module and a package beside it, a package
    run with `-m` (with a `__main__`), and an app folder run as `python app/`. Returns {path: text}."""
    files = {"train.py": "import helpers\n", "helpers.py": "X = 1\n", "lib/__init__.py": "", "lib/models.py": "M = 1\n",
             "pkg/__init__.py": "", "pkg/__main__.py": "print('main')\n", "pkg/train.py": "import pkg.util\n",
             "pkg/util.py": "U = 1\n", "app/__main__.py": "import appmod\n", "app/appmod.py": "A = 1\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return files


@pytest.mark.parametrize("args, message", [
    (["bench", "--out", "pkg/train.py", "--", "python", "-m", "pkg.train"], "is the module 'pkg.train'"),
    (["bench", "--out", "pkg/__main__.py", "--", "python", "-m", "pkg"], "is the module 'pkg' ('pkg/__main__.py')"),
    (["profile", "--trace", "app/__main__.py", "--", "python", "app"], "is the script's __main__.py"),
    (["bench", "--out", "app/appmod.py", "--", "python", "app/"], "Python source the script can import"),
    (["profile", "--trace", "helpers.py", "--", "python", "train.py"], "Python source the script can import"),
    (["compare", "--out", "lib/models.py", "--", "python", "train.py"], "Python source the script can import"),
    (["tune", "--out", "pkg/util.py", "--", "python", "-m", "pkg.train"], "Python source the script can import"),
    (["tune", "--report", "helpers.py", "--", "python", "-m", "pkg.train"], "Python source the script can import"),
    (["monitor", "--csv", "helpers.py", "--", "python", "train.py"], "Python source the script can import"),
    (["bench", "--out", "link.py", "--", "python", "train.py"], "Python source the script can import"),
])
def test_an_output_that_is_what_the_command_runs_or_imports_is_refused(cli_run, project, tmp_path, args, message):
    (tmp_path / "link.py").symlink_to(tmp_path / "lib" / "models.py")
    done = cli_run(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "choose another path" in done.stderr, done.stderr
    assert all((tmp_path / name).read_text() == text for name, text in project.items())


def test_outputs_beside_the_script_that_are_not_its_source_are_allowed(project, tmp_path, monkeypatch):
    from torchpace.cli._common import check_outputs
    from torchpace.cli._script import script_inputs, script_sources

    monkeypatch.chdir(tmp_path)
    for command in (["python", "train.py"], ["python", "-m", "pkg.train"], ["python", "app"]):
        check_outputs({"--out": "result.json", "--report": "new_module.py", "--trace": "lib/trace.json.gz"},
                      script_inputs(command, None), source_dirs=script_sources(command))


# ---- every number and name is bounded before anything starts ------------------------------------------

@pytest.mark.parametrize("args, named", [
    (["bench", "--max-time", "3e6"], "--max-time"), (["compare", "--max-time", "3e6", "--set", "threads.intra_op=1"],
                                                     "--max-time"),
    (["tune", "--trial-time", "1e7"], "--trial-time"), (["bench-data", ".", "--max-time", "1e9"], "--max-time"),
    (["tune", "--budget", "100000h"], "--budget"), (["tune", "--budget", "1e3"], "--budget"),
    (["tune", "--max-trials", "1000000000"], "--max-trials"),
    (["bench-data", ".", "--batch-size", "1000000000000"], "--batch-size"),
    (["shard", ".", "--out", "s", "--shard-size", "1000000000000"], "--shard-size"),
    (["shard", ".", "--out", "s", "--shuffle", "--seed", "-1"], "--seed"),
    (["shard", ".", "--out", "s", "--shuffle", "--seed", "99999999999"], "--seed"),
    (["tune", "--accuracy-rtol", "1e300"], "--accuracy-rtol"),
    (["launch", "--dry-run", "--nnodes", "1000000000", "--rdzv-endpoint", "h:1", "--", "job.py"], "--nnodes"),
    (["launch", "--dry-run", "--nnodes", "2", "--node-rank", "5", "--rdzv-endpoint", "h:1", "--", "job.py"], "--node-rank"),
    (["launch", "--dry-run", "--nofile", "1000000000000", "--", "job.py"], "--nofile"),
    (["bench", "--samples-per-step", "1000000000000", "--", "python", "job.py"], "--samples-per-step"),
    (["launch", "--dry-run", "--rdzv-endpoint", "h:70000", "--", "job.py"], "--rdzv-endpoint"),
    (["bench", "inference", "--set", "inference.batch_size=1000000000000", "--max-time", "1"], "inference.batch_size"),
])
def test_a_number_beyond_its_range_is_exit_2_naming_the_option_before_anything_starts(cli_run, tmp_path, args, named):
    (tmp_path / "job.py").write_text("open('ran', 'w').write('yes')\n")
    done = cli_run(*args, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / ".torchpace").exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize("verb", [["bench"], ["tune"], ["compare", "--set", "threads.intra_op=1"]])
def test_samples_per_step_without_a_script_is_refused_as_its_sibling_flag_is(cli_run, verb):
    done = cli_run(*verb, "--samples-per-step", "32", "tabular", timeout=120)
    assert done.returncode == 2 and "--samples-per-step" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("name, said", [("s" * 300, "at most"), ("", "empty"), ("a\nb", "control"), (".", "'.'"),
                                        ("..", "'..'")])
def test_a_study_name_that_cannot_be_one_is_exit_2_and_leaves_no_study(cli_run, tmp_path, name, said):
    (tmp_path / "job.py").write_text("open('ran', 'w').write('yes')\n")
    for argv in (["tune", "--study", name, "--max-trials", "1"], ["tune", "--study", name, "--", "python", "job.py"]):
        done = cli_run(*argv, timeout=120)
        assert done.returncode == 2 and "--study" in done.stderr and said in done.stderr, done.stderr[-3000:]
        assert "Traceback" not in done.stderr and not (tmp_path / "ran").exists()
        assert not (tmp_path / ".torchpace" / "studies.db").exists()


def test_study_names_that_differ_only_in_characters_a_folder_name_replaces_get_their_own_log_folders():
    from torchpace.trial.output import LOG_DIR, trial_log_path

    names = ["a b", "a_b", "a/b", "a:b", "a__b", "a\\b", "..", ".", "-x", "é", "e", "s" * 128, "s" * 127 + "t", "A b"]
    folders = [trial_log_path(name, 0).parent for name in names]
    assert len(set(folders)) == len(names), folders
    for folder in folders:
        assert folder.parent == LOG_DIR and folder.name not in ("", ".", "..") and len(folder.name.encode()) <= 255
        assert "/" not in folder.name and not folder.name.startswith(".")
    assert trial_log_path("torchpace-train.py", 3).parent.name == "torchpace-train.py"  # a plain name stays readable


@pytest.mark.parametrize("facts, named", [({"gpus": 2}, "gpus"), ({"usable_cores": 100000000}, "usable_cores"),
                                          ({"numa_nodes": 100000000}, "numa_nodes"), ({"gpus": 100000000}, "gpus")])
def test_faked_host_facts_beyond_a_real_host_or_this_torch_are_exit_2_before_anything_starts(cli_run, facts, named):
    import json

    import torch

    if "gpus" in facts and facts["gpus"] < 64 and torch.cuda.is_available():
        pytest.skip("a CUDA build of torch can plan for faked GPUs")
    done = cli_run("bench", "--max-time", "1", env_extra={"TORCHPACE_HOST_FACTS": json.dumps(facts)}, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "TORCHPACE_HOST_FACTS" in done.stderr and named in done.stderr and "Traceback" not in done.stderr, done.stderr
