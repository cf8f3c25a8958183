"""What every verb shares: error-to-exit-code mapping, JSON output, the Rich console, and the one
check every verb that writes makes before it starts (`check_outputs`)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import click

from torchpace.errors import ScriptFailed, TorchpaceError, UsageError, UserCodeError
from torchpace.files import write_atomic
from torchpace.redact import redacting_streams, remember_command_secrets
from torchpace.stop_policy import stop_exit_code, stop_reason, stop_signals_raise

PathLike = str | os.PathLike
# what a program imports as Python: source, bytecode and extension modules
_PYTHON_SUFFIXES = frozenset({*importlib.machinery.SOURCE_SUFFIXES, *importlib.machinery.BYTECODE_SUFFIXES,
                              ".so", ".pyd", ".pth"})


def run_cli(group: click.Group, argv: list[str] | None) -> int:
    """Run the click group under the one stop-signal policy and with secrets masked in every output (the
    secrets on its own command line remembered, in every spelling); map torchpace errors to a stderr message
    and their exit code.

    SIGINT, SIGTERM and SIGHUP unwind the command (every child's tree stopped, temporary folders
    removed: `torchpace.stop_policy.stop_signals_raise`) and exit 130, 143 and 129."""
    def say_emergency(line: str) -> None:
        click.echo(f"torchpace: {line}", err=True)

    remember_command_secrets(sys.argv[1:] if argv is None else argv)  # a URL's password, `--token X`: masked wherever they show
    with redacting_streams():
        try:
            with stop_signals_raise(say_emergency):
                return _run_group(group, argv)
        except KeyboardInterrupt as stop:  # outside click's own handling (rare), or as the policy ended
            click.echo(f"torchpace: {stop_reason(stop)}", err=True)
            return stop_exit_code(stop)


def _run_group(group: click.Group, argv: list[str] | None) -> int:
    try:
        result = group.main(args=argv, prog_name="torchpace", standalone_mode=False)
    except UserCodeError as err:
        what = ("output of YOUR script (not torchpace), its last lines", "end of your script's output") \
            if isinstance(err, ScriptFailed) \
            else ("traceback from YOUR code (not torchpace)", "end of your traceback")
        click.echo(f"torchpace: error: {str(err).rstrip('.')}.", err=True)
        click.echo(f"---- {what[0]} ----", err=True)
        click.echo(err.user_traceback.rstrip(), err=True)
        click.echo(f"---- {what[1]} ----", err=True)
        return err.exit_code
    except TorchpaceError as err:
        click.echo(f"torchpace: error: {err}", err=True)
        return err.exit_code
    except click.exceptions.Exit as err:
        return err.exit_code
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except click.Abort as err:  # click turns a KeyboardInterrupt (Ctrl-C, or SIGTERM's `Terminated`) into Abort
        stop = err.__cause__ if isinstance(err.__cause__, KeyboardInterrupt) else KeyboardInterrupt()
        click.echo(f"torchpace: {stop_reason(stop)}", err=True)
        return stop_exit_code(stop)
    return result if isinstance(result, int) else 0


def json_option(func):
    """The `--json` flag every reporting verb has."""
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (its fields: the verb's guide in docs/guide/).")(func)


def emit_json(payload: dict[str, Any]) -> None:
    """Write `payload` as indented JSON to stdout."""
    json.dump(payload, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def save_result(payload: dict[str, Any], path: PathLike) -> Path:
    """Write a JSON result (every verb's `--out`) atomically (`torchpace.files`; secrets masked).

    Raises:
        OutputWriteFailed: the file could not be written (full disk, permissions); nothing is left behind.
    """
    return write_atomic(path, json.dumps(payload, indent=2))


def make_console(stderr: bool = False):
    """A Rich console (imported lazily: `--help` must stay light)."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def output_result(payload: dict[str, Any], out_path: str | None, as_json: bool, render) -> None:
    """Print `payload` as JSON or with `render(console, payload)`, then save it to `out_path` (if given).

    Printed first: when the file cannot be written (a full disk), the figures are on the terminal and
    the `OutputWriteFailed` that follows is one line (exit 1)."""
    if as_json:
        emit_json(payload)
    else:
        render(make_console(), payload)
    if out_path:
        save_result(payload, out_path)


def check_outputs(outputs: Mapping[str, PathLike | None], inputs: Iterable[tuple[str, PathLike | None]] = (),
                  input_dirs: Iterable[tuple[str, PathLike | None]] = (), out_dirs: Iterable[str] = (),
                  source_dirs: Iterable[tuple[str, PathLike | None]] = ()) -> None:
    """UsageError (exit 2) before any work when an output of this run could destroy data or cannot be written.

    The rule: no output is an input of the same run (the same file, through a symlink or a hard link
    too: same device and inode), none lies inside an input folder, none is an existing Python file (source,
    bytecode, extension) in a folder the program imports from, no two outputs are one file, and each can
    be written.

    Args:
        outputs: option name (e.g. "--out") -> path this run writes (None: not asked for).
        inputs: (what it is, e.g. "the workload file", its path) for each file this run reads.
        input_dirs: (what it is, its path) for each folder this run reads (nothing is written inside).
        out_dirs: the option names in `outputs` that name a folder (created when missing).
        source_dirs: (what it is, its path) for each folder the program imports Python from (a script's
            folder, its package: `cli/_script.script_sources`); outputs may be written there, but not over
            the Python files in it or below it.
    """
    given = {name: Path(path) for name, path in outputs.items() if path is not None}
    inputs, input_dirs, source_dirs = list(inputs), list(input_dirs), list(source_dirs)
    for name, path in given.items():
        _check_not_an_input(name, path, inputs, input_dirs)
        _check_not_a_source(name, path, source_dirs)
        _check_can_write(name, path, is_dir=name in out_dirs)
    seen: dict[Path, str] = {}
    for name, path in given.items():
        other = seen.setdefault(path.resolve(), name)
        if other != name:
            raise UsageError(f"{other} and {name} are both {str(path)!r}: one would overwrite the other; "
                             "choose another path for one of them")


def _check_not_an_input(name: str, path: Path, inputs: list[tuple[str, PathLike | None]],
                        input_dirs: list[tuple[str, PathLike | None]]) -> None:
    for what, source in inputs:
        if source is not None and is_same_file(path, Path(source)):
            raise UsageError(f"{name} {str(path)!r} is {what} {str(source)!r}: writing it would destroy "
                             "that input; choose another path")
    for what, folder in input_dirs:
        if folder is not None and path.resolve().is_relative_to(Path(folder).resolve()):
            raise UsageError(f"{name} {str(path)!r} is inside {what} {str(folder)!r}, which this run reads; "
                             "choose a path outside it")


def _check_not_a_source(name: str, path: Path, source_dirs: list[tuple[str, PathLike | None]]) -> None:
    """UsageError when `path` is an existing Python file (through a link too) the program can import."""
    if not os.path.lexists(path):
        return
    found = [p for p in (path, path.resolve()) if p.suffix in _PYTHON_SUFFIXES]
    for what, folder in source_dirs:
        if folder is None:
            continue
        root = Path(folder).resolve()
        if any(p.resolve().is_relative_to(root) or p.absolute().is_relative_to(Path(folder).absolute()) for p in found):
            raise UsageError(f"{name} {str(path)!r} is Python source the script can import (in {what}, {str(folder)!r}): "
                             "writing it would destroy that input; choose another path")


def is_same_file(a: Path, b: Path) -> bool:
    """True when `a` and `b` are one file: the same path after symlinks, or the same inode (hard links)."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _check_can_write(name: str, path: Path, is_dir: bool) -> None:
    """UsageError when `path` cannot be written: a file's folder must exist and be writable; a folder
    must be writable, or the nearest folder above it that exists must be."""
    if is_dir:
        if path.exists() and not path.is_dir():
            raise UsageError(f"{name} {str(path)!r} is a file, and a folder is needed here")
        existing = next(p for p in (path.resolve(), *path.resolve().parents) if p.exists())
        ok = existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)
    else:
        if path.is_dir():
            raise UsageError(f"{name} {str(path)!r} is a folder, and a file name is needed here")
        parent = path.resolve().parent
        ok = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK) and (not path.exists() or os.access(path, os.W_OK))
    if not ok:
        raise UsageError(f"{name} {str(path)!r} cannot be written (is the folder there, and writable?)")


def check_knob_limit(option: str, knob: str, value: Any, host: Any) -> None:
    """UsageError when an integer `option` sets `knob` beyond what this host allows (the knob's own
    limit, e.g. DataLoader workers per core); None and named values such as "auto" pass."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.knobs import get_knob

    reason = isinstance(value, int) and get_knob(knob).host_reason(value, host)
    if reason:
        raise UsageError(f"{option} {value}: {reason}")


def workload_file(spec: str | None) -> Path | None:
    """The Python file a workload spec reads (`file.py:fn`, or a module's source), else None.

    A built-in name or a module that cannot be found reads no file of the user's (`load_workload`
    reports a spec that does not resolve)."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.workload import BUILTIN_WORKLOADS

    if not spec or spec in BUILTIN_WORKLOADS:
        return None
    target = spec.rpartition(":")[0]
    if target.endswith(".py") or "/" in target:
        return Path(target)
    # lazy: every command, --help included, loads this module; this loads only when used
    import importlib.util

    top, *inner = target.split(".")
    try:
        found = importlib.util.find_spec(top)  # finding a top-level module runs none of its code
    except (ImportError, ValueError):  # not a module name: load_workload says so
        return None
    if found is None or not found.origin or not os.path.isfile(found.origin):
        return None
    if not inner:
        return Path(found.origin)
    module = Path(found.origin).parent.joinpath(*inner)
    return next((p for p in (module.with_suffix(".py"), module / "__init__.py") if p.is_file()), None)


def study_file(storage: str | None) -> Path | None:
    """The SQLite file a study lives in: `--storage`'s, or tune's default file when None (None for a
    server database)."""
    # lazy: every command, --help included, loads this module; this loads only when used
    from torchpace.tune.storage import DEFAULT_STUDY_FILE, sqlite_database

    if storage is None:
        return DEFAULT_STUDY_FILE
    database = sqlite_database(storage)
    return Path(database) if database else None


def command_files(command: Iterable[str]) -> list[tuple[str, Path]]:
    """The existing files a command line names (`train.py`, `--data=x.csv`), as inputs of its run."""
    parts = [part for arg in command for part in (arg, arg.partition("=")[2])]
    return [("a file the command names", Path(part)) for part in parts if part and os.path.isfile(part)]


__all__ = ["run_cli", "json_option", "emit_json", "make_console", "output_result", "check_outputs",
           "is_same_file", "check_knob_limit", "workload_file", "study_file", "command_files"]
