"""torchpace's log: `-v` shows its records on stderr, `-q` only errors, importing torchpace configures
nothing, and a storage URL in a record has its password masked."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from torchpace import cli as cli_module
from torchpace.cli import main
from torchpace.logs import EnvChanges, cli_flags


@pytest.fixture
def log_verb(tmp_path, monkeypatch):
    """A verb `logs` that logs one record at each level under `torchpace.`, run through the real group."""
    (tmp_path / "torchpace_log_verb.py").write_text(textwrap.dedent('''
        import logging

        import click

        @click.command("logs")
        def command():
            log = logging.getLogger("torchpace.log_verb")
            for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
                log.log(level, "record at %s", logging.getLevelName(level))
            click.echo("the verb's own output")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli_module._VERBS, "logs", ("torchpace_log_verb", "logs one record per level"))


@pytest.mark.parametrize("flags, shown", [
    (["-v"], ["DEBUG", "INFO", "WARNING", "ERROR"]),
    ([], ["WARNING", "ERROR"]),
    (["-q"], ["ERROR"]),
])
def test_verbosity_chooses_the_records_shown_on_stderr_and_leaves_output_alone(log_verb, capsys, flags, shown):
    assert main([*flags, "logs"]) == 0
    out, err = capsys.readouterr()
    assert out == "the verb's own output\n"
    seen = [level for level in ("DEBUG", "INFO", "WARNING", "ERROR") if f"record at {level}" in err]
    assert seen == shown
    assert f"{shown[0]} torchpace.log_verb: record at {shown[0]}" in err  # level and module in every line


def test_the_command_leaves_the_logger_as_it_found_it(log_verb, capsys):
    logger = logging.getLogger("torchpace")
    before = (list(logger.handlers), logger.level, logger.propagate)
    main(["-v", "logs"])
    assert (list(logger.handlers), logger.level, logger.propagate) == before


def test_verbose_and_quiet_together_are_a_usage_error(log_verb, capsys):
    assert main(["-v", "-q", "logs"]) == 2
    assert "-v/--verbose and -q/--quiet" in capsys.readouterr().err


def test_importing_torchpace_configures_no_logging():
    code = textwrap.dedent('''
        import importlib, logging, pkgutil, torchpace
        for module in pkgutil.walk_packages(torchpace.__path__, "torchpace."):
            if not module.name.endswith(("__main__", "sitecustomize")):
                importlib.import_module(module.name)
        own, root = logging.getLogger("torchpace"), logging.getLogger()
        assert not own.handlers and own.level == logging.NOTSET and own.propagate, (own.handlers, own.level)
        assert not root.handlers and root.level == logging.WARNING, (root.handlers, root.level)
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_verbose_launch_logs_the_child_it_starts_and_how_it_ended(cli_run, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hello from the script')\n")
    done = cli_run("-v", "launch", "--omp-threads", "1", "--", "python", str(script), env_extra={"OMP_NUM_THREADS": "2"},
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hello from the script" in done.stdout
    started = next(line for line in done.stderr.splitlines() if "torchpace.process: starting" in line)
    assert str(script) in started and "OMP_NUM_THREADS=1" in started  # argv and the planned environment
    assert "OMP_NUM_THREADS = 1 (cli:" in done.stderr  # the plan's decisions with their source
    assert "ended with exit status 0" in done.stderr
    quiet = cli_run("launch", "--omp-threads", "1", "--", "python", str(script), cwd=tmp_path)
    assert quiet.returncode == 0 and "torchpace.process" not in quiet.stderr


def test_env_changes_name_what_the_child_gets_differently():
    base = {"KEEP": "1", "CHANGE": "old", "DROP": "x"}
    assert str(EnvChanges({"KEEP": "1", "CHANGE": "new", "ADD": "2"}, base)) == "ADD=2 CHANGE=new -DROP"
    assert str(EnvChanges(dict(base), base)) == "none"
    assert str(EnvChanges(None, base)) == "none (inherited)"


def test_a_torchpace_command_started_from_this_one_gets_the_same_flags():
    logger = logging.getLogger("torchpace")
    before = logger.level
    try:
        for level, flags in ((logging.DEBUG, ["-v"]), (logging.WARNING, []), (logging.ERROR, ["-q"])):
            logger.setLevel(level)
            assert cli_flags() == flags
    finally:
        logger.setLevel(before)


def test_a_storage_url_is_logged_with_its_password_masked(caplog):
    from torchpace.errors import UsageError
    from torchpace.tune.storage import open_storage

    caplog.set_level(logging.INFO, logger="torchpace")
    with pytest.raises(UsageError):  # nothing listens on port 9 here: refused at once
        open_storage("postgresql://tuner:s3cret-word@127.0.0.1:9/studies")
    logged = [r.getMessage() for r in caplog.records if r.name == "torchpace.tune.storage"]
    assert logged and all("s3cret-word" not in message for message in logged)
    assert any("tuner:***@127.0.0.1:9/studies" in message for message in logged)
