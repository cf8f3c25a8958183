"""The Python program after `--`: `python train.py`, `python -m pkg.mod`, `train.py`; anything else is
a usage error pointing to `monitor`. Pure parsing, plus the launch command line end to end."""

from __future__ import annotations

import pytest

from launch_helpers import WORKERS, run_launch
from torchpace.cli import main
from torchpace.cli.launch import interpreter_note
from torchpace.errors import UsageError
from torchpace.launch.command import PythonCommand, is_python_interpreter, parse_python_command

SCRIPT = str(WORKERS / "exit_with.py")


@pytest.mark.parametrize("argv, expected", [
    (["train.py", "--lr", "3"], PythonCommand(script="train.py", args=("--lr", "3"))),
    (["python", "train.py", "--lr", "3"], PythonCommand(script="train.py", args=("--lr", "3"), interpreter="python")),
    (["python3", "-m", "pkg.train", "-m", "x"], PythonCommand(module="pkg.train", args=("-m", "x"), interpreter="python3")),
    (["/opt/py/bin/python3.11", "-u", "-X", "dev", "-Werror", "run.py"],
     PythonCommand(script="run.py", interpreter="/opt/py/bin/python3.11", interpreter_args=("-u", "-X", "dev", "-Werror"))),
    (["python", "-OO", "-mpkg.train"], PythonCommand(module="pkg.train", interpreter="python", interpreter_args=("-OO",))),
    (["pypy3", "./scripts/train.pyw"], PythonCommand(script="./scripts/train.pyw", interpreter="pypy3")),
])
def test_python_programs_are_recognised(argv, expected):
    command = parse_python_command(argv)
    assert command == expected
    assert command.argv("/venv/bin/python")[1:] == [*expected.interpreter_args, *expected.program()]


@pytest.mark.parametrize("argv, message", [
    ([], "missing the command"),
    (["bash", "run.sh"], "'bash' is not a Python program"),
    (["./train"], "'./train' is not a Python program"),
    (["-m", "pkg.train"], "'-m' is not a script: put torchpace's options before `--`"),
    (["python"], "runs no program"),
    (["python", "-u"], "runs no program"),
    (["python", "-m"], "names no module"),
    (["python", "-c", "print(1)"], "`python -c` is not supported here"),
    (["python", "-"], "reads the program from stdin"),
    (["python", "-I", "train.py"], "-I (isolated mode) makes Python ignore PYTHONPATH"),
    (["python", "-uS", "train.py"], "-S stops Python from importing site"),
    (["python", "-X"], "needs a value"),
    (["python", "-Z", "train.py"], "unknown interpreter option -Z"),
])
def test_what_is_not_a_python_program_is_a_usage_error(argv, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_python_command(argv)


def test_the_usage_error_says_monitor_runs_anything():
    with pytest.raises(UsageError, match=r"torchpace monitor -- CMD` runs any command"):
        parse_python_command(["bash", "run.sh"])


def test_interpreter_names():
    assert all(map(is_python_interpreter, ["python", "python3", "python3.11", "/usr/bin/python3", "pypy3"]))
    assert not any(map(is_python_interpreter, ["bash", "python-config", "pythonista", "train.py"]))


def test_interpreter_note_only_when_the_named_one_is_another_file(tmp_path):
    other = tmp_path / "python3.11"
    other.write_text("")
    assert interpreter_note(None, None, "/venv/bin/python") is None
    assert interpreter_note("python", str(other), str(other)) is None
    note = interpreter_note("python3.11", str(other), "/venv/bin/python")
    assert "runs with /venv/bin/python" in note and f"`{other} -m torchpace launch" in note


@pytest.mark.parametrize("command", [["python", SCRIPT, "0"], ["python3", SCRIPT, "0"], [SCRIPT, "0"]])
def test_launch_dry_run_takes_python_before_the_script(command, child_env):
    result = run_launch(["--dry-run", "--", *command], child_env)
    assert result.returncode == 0, result.stderr
    assert f"{SCRIPT} 0" in result.stdout


def test_launch_runs_a_module_with_this_interpreter(tmp_path, child_env):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hello.py").write_text("import sys\nopen(sys.argv[1], 'w').write(' '.join(sys.argv[2:]))\n")
    out = tmp_path / "out.txt"
    env = {**child_env, "PYTHONPATH": str(tmp_path)}
    result = run_launch(["--", "python", "-m", "pkg.hello", str(out), "a", "b"], env)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == "a b"


def test_launch_of_a_shell_script_exits_2(capsys):
    assert main(["launch", "--", "bash", "run.sh"]) == 2
    err = capsys.readouterr().err
    assert "'bash' is not a Python program" in err and "torchpace monitor" in err


@pytest.mark.parametrize(("module", "refused"), [
    ("pkg.sub.train", None), ("pkg.mod", None), ("app", None), ("http.server", None),
    ("pkg", "is a package with no __main__ to run"), ("pkg.sub", "is a package with no __main__ to run"),
    ("pkg.nope", "package 'pkg' .* has no 'nope'"), ("pkg.mod.x", "'pkg.mod' is a module, not a package"),
    ("no_such_top_torchpace", "no 'no_such_top_torchpace' in"),
])
def test_a_module_python_could_not_run_is_refused_before_it_starts_and_none_is_imported(tmp_path, module, refused):
    from torchpace.launch.command import check_program_exists

    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "app").mkdir()
    for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/mod.py", "pkg/sub/train.py", "app/__main__.py"):
        (tmp_path / name).write_text("raise SystemExit('imported')\n")  # finding a module must run none of it
    program = parse_python_command(["python", "-m", module])
    if refused is None:
        check_program_exists(program, cwd=tmp_path)
        return
    with pytest.raises(UsageError, match=refused):
        check_program_exists(program, cwd=tmp_path)
