"""The Python program after `--`: `python train.py ARGS`, `python -m pkg.module ARGS` or `train.py ARGS`, or a
launcher that runs one on every rank (`torchrun ARGS train.py`, `accelerate launch ARGS train.py`, `python -m
torch.distributed.run ARGS train.py`: `torchpace.launch.launchers`).

`parse_python_command` is pure (it reads no file): it tells a Python program from any other command
and returns a `PythonCommand`, which `launch` and script mode (`bench`/`tune`/`profile -- CMD`) run.
Both need a *Python* process, because torchpace's sitecustomize hook must load inside it; any other
command (`bash run.sh`) is a UsageError that points to `torchpace monitor`, which runs anything.

The interpreter the user names (`python`, `python3`, `/opt/py/bin/python3.11`) is recognised as a
Python and then replaced by the interpreter torchpace runs in (`sys.executable`, given to the planner
as `LaunchFacts.python`): torchpace's own modules (the hook, the torchrun wrapper, the NUMA binder)
must import in the child, and the tuner's trials ran with this interpreter, so a tuned config runs
with the same torch it was measured with. To use another interpreter, run torchpace with it
(`/opt/py/bin/python3.11 -m torchpace launch ...`); `launch` notes when the named one differs.
Interpreter options that stop the hook from loading (`-E`, `-I`, `-S`) are refused; others (`-u`,
`-O`, `-X dev`, `-W error`) are kept.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import shlex
import sys
import zipfile
from dataclasses import dataclass
from typing import Sequence

from torchpace.errors import UsageError
from torchpace.launch.launchers import LAUNCHER_MODULES, Launcher, launcher_of, launcher_words, parse_launcher

_PYTHON_NAME = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?$")
_SCRIPT_SUFFIXES = (".py", ".pyw")
_FLAGS = set("bBdOPqsuv")  # interpreter options without a value, kept as given
_VALUED = set("WX")  # options whose value follows (attached or as the next argument)
_HOOK_BREAKERS = {
    "E": "-E makes Python ignore PYTHONPATH, which loads torchpace's hook",
    "I": "-I (isolated mode) makes Python ignore PYTHONPATH, which loads torchpace's hook",
    "S": "-S stops Python from importing site, which loads torchpace's hook",
}
_ANY_COMMAND = ("torchpace launch and script mode (bench, tune, profile -- CMD) start a Python process they can "
                "hook: give `python train.py ARGS`, `python -m pkg.module ARGS` or `train.py ARGS`; "
                "`torchpace monitor -- CMD` runs any command")


@dataclass(frozen=True)
class PythonCommand:
    """A Python program to run: a script file or a module, with its arguments.

    Attributes:
        script: the script's path (None when a module runs).
        module: the module run with `-m` (None when a script runs).
        args: the program's own arguments.
        interpreter: the interpreter as the user named it (None for a bare `train.py`); informative
            only, see the module docstring.
        interpreter_args: interpreter options given before the program (`-u`, `-X dev`).
        launcher: the launcher this command runs (`torchrun`, `accelerate launch`), which starts `training`
            on every rank; None for a program that runs directly (it may still start ranks of its own).
    """

    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    interpreter: str | None = None
    interpreter_args: tuple[str, ...] = ()
    launcher: Launcher | None = None

    def __post_init__(self) -> None:
        if (self.script is None) == (self.module is None):
            raise ValueError("a PythonCommand runs either a script or a module")

    @property
    def label(self) -> str:
        """The program as messages name it: `train.py`, `-m pkg.module`, `torchrun train.py`."""
        if self.launcher is not None:
            return self.launcher.label()
        return self.script if self.script is not None else f"-m {self.module}"

    @property
    def training(self) -> "PythonCommand":
        """The training program itself: what a launcher runs on each rank, else this command."""
        return self.launcher.program if self.launcher is not None else self

    @property
    def name(self) -> str:
        """The training program's short name (a study's name is made from it): `train.py`, `pkg.train`."""
        training = self.training
        return os.path.basename(training.script) if training.script is not None else str(training.module)

    def program(self) -> list[str]:
        """What follows the interpreter and its options: `train.py ARGS` or `-m pkg.module ARGS`."""
        head = [self.script] if self.script is not None else ["-m", str(self.module)]
        return [*head, *self.args]

    def argv(self, python: str) -> list[str]:
        """The whole command with interpreter `python`."""
        return [python, *self.interpreter_args, *self.program()]


def parse_python_command(argv: Sequence[str]) -> PythonCommand:
    """The Python program `argv` runs.

    Args:
        argv: the command after `--`, e.g. `["python", "-m", "pkg.train", "--lr", "3"]`.

    Returns:
        The PythonCommand (`train.py ARGS` alone means the same as `python train.py ARGS`).

    Raises:
        UsageError: no command, an option where the command should be, a command that is not a
            Python program, or a Python invocation with no program to run (`python`, `python -c`).
    """
    if not argv:
        raise UsageError("missing the command: put a Python program after `--` (e.g. `-- python train.py ARGS`)")
    first = argv[0]
    launcher = launcher_of(argv)
    if launcher is not None:
        return launched(parse_launcher(launcher, argv[launcher_words(argv):], _launched_program(launcher)))
    if first.startswith("-"):
        raise UsageError(f"{first!r} is not a script: put torchpace's options before `--` and the command after it "
                         "(e.g. `-- python train.py` or `-- python -m pkg.train`)")
    if is_python_interpreter(first):
        return _parse_interpreter_args(first, argv[1:])
    if first.endswith(_SCRIPT_SUFFIXES):
        return PythonCommand(script=first, args=tuple(argv[1:]))
    raise UsageError(f"{first!r} is not a Python program (a Python interpreter or a .py file); {_ANY_COMMAND} "
                     "(a Python script without the .py suffix runs as `python FILE ARGS`)")


def _launched_program(name: str):
    """How launcher `name`'s parsed options name the program each rank runs (`launchers.ProgramOf`)."""
    def program_of(parsed, script: str, rest: list) -> PythonCommand:
        if getattr(parsed, "no_python", False):
            try:
                return parse_python_command([script, *rest])
            except UsageError as err:
                raise UsageError(f"`{name} --no-python {script}` runs {script!r} as it is, and torchpace measures Python "
                                 f"programs: {err}") from err
        if getattr(parsed, "module", False):
            return PythonCommand(module=script, args=tuple(rest))
        return PythonCommand(script=script, args=tuple(rest))

    return program_of


def launched(launcher: Launcher, interpreter: str | None = None, interpreter_args: tuple[str, ...] = ()) -> PythonCommand:
    """The command that runs `launcher` as a module of torchpace's interpreter (`python -m MODULE ARGS PROGRAM`)."""
    return PythonCommand(module=launcher.module, args=tuple(launcher.argv_tail()), interpreter=interpreter,
                         interpreter_args=interpreter_args, launcher=launcher)


def check_program_exists(program: PythonCommand, cwd: str | os.PathLike | None = None,
                         pythonpath: str | None = None) -> None:
    """UsageError (exit 2, before anything starts) when the program Python would run is not there: a
    script that is no file, no folder with `__main__.py` (Python runs those, as it runs a zip archive),
    or a module that cannot be found from `cwd`, `pythonpath` and this interpreter's path (its top-level
    package, each part of its dotted name, and the `__main__` of a package run with `-m`).

    Finding a module runs none of its code (`importlib.machinery.PathFinder`)."""
    _find_program(program, cwd, pythonpath)


def _find_program(program: PythonCommand, cwd: str | os.PathLike | None, pythonpath: str | None):
    """The spec of the module `program` runs (a package's `__main__`), None for a script or a module that is not
    a file (built in, frozen); UsageError as `check_program_exists`."""
    cwd = os.fspath(cwd or os.getcwd())
    program = program.training
    if program.script is not None:
        path = os.path.join(cwd, program.script)
        if os.path.isfile(path) or os.path.isfile(os.path.join(path, "__main__.py")):
            return None
        what = "has no __main__.py to run" if os.path.isdir(path) else "not found"
        raise UsageError(f"script {program.script!r} {what} (relative paths start from {cwd})")
    top = str(program.module).split(".")[0]
    if top in sys.builtin_module_names or importlib.machinery.FrozenImporter.find_spec(top) is not None:
        return None
    search = [cwd, *[p for p in (pythonpath or "").split(os.pathsep) if p], *sys.path[1:]]
    spec = importlib.machinery.PathFinder.find_spec(top, search) or _meta_path_spec(top)
    if spec is None:
        raise UsageError(f"module {program.module!r} not found: no {top!r} in {cwd} or on this Python's path "
                         "(is it installed in the environment torchpace runs in?)")
    return _check_submodules(str(program.module), spec)


def program_sources(program: PythonCommand, cwd: str | os.PathLike | None = None,
                    pythonpath: str | None = None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """What `program` runs and can import of the user's own, as inputs no output may overwrite: (files, folders).

    Files: the script (a folder's `__main__.py`) or the module's source file. Folders, whose Python files
    are the program's source: the script's folder (Python puts it first on `sys.path`: its siblings and the
    packages beside it are what it imports), a folder run as `python app/`, the working folder for `-m`
    (Python puts it first then) and the module's top-level package. A zip archive is its own source.
    Each is (what it is, as messages name it; its path). Finding them imports nothing.

    Raises:
        UsageError: the program is not there (as `check_program_exists`).
    """
    cwd = os.fspath(cwd or os.getcwd())
    spec = _find_program(program, cwd, pythonpath)
    program = program.training
    if program.script is not None:
        path = os.path.join(cwd, program.script)
        if os.path.isdir(path):
            return [("the script's __main__.py", os.path.join(program.script, "__main__.py"))], [("the folder it runs", path)]
        if zipfile.is_zipfile(path):  # Python imports from the archive itself, not from its folder
            return [("the script", program.script)], []
        return [("the script", program.script)], [("the script's folder", os.path.dirname(path))]
    folders = [("the working folder (`python -m` imports from it)", cwd)]
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return [], folders
    top = str(program.module).split(".")[0]
    found = importlib.machinery.PathFinder.find_spec(top, [cwd, *[p for p in (pythonpath or "").split(os.pathsep) if p],
                                                           *sys.path[1:]])
    if found is not None and found.submodule_search_locations:
        folders += [(f"package {top!r}", location) for location in found.submodule_search_locations]
    return [(f"the module {program.module!r}" + (f" ({os.path.relpath(spec.origin, cwd)!r})"
                                                   if spec.name.endswith(".__main__") else ""), spec.origin)], folders


def _meta_path_spec(top: str):
    """`top` as the other finders of this interpreter find it (an editable install's finder), or None."""
    standard = (importlib.machinery.PathFinder, importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter)
    for finder in sys.meta_path:
        if finder in standard or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(top, None)
        except Exception:  # a third-party finder's own trouble: not a verdict on the module
            continue
        if spec is not None:
            return spec
    return None


def _check_submodules(module: str, spec):
    """The spec of what `python -m module` runs (a package's `__main__`), past its top-level package `spec`;
    UsageError when it could not run: a part of the dotted name that is not in its package's folders, or a
    package without a `__main__` (what `-m PKG` runs). Found as Python's path finder finds them, importing nothing."""
    parts = module.split(".")
    for index in range(1, len(parts) + 1):
        name = ".".join(parts[:index])
        locations = spec.submodule_search_locations
        if index == len(parts):
            if locations is None:
                return spec
            main = importlib.machinery.PathFinder.find_spec(f"{name}.__main__", list(locations))
            if main is None:
                raise UsageError(f"module {module!r} is a package with no __main__ to run (`python -m {module}` runs "
                                 f"{module.replace('.', '/')}/__main__.py): name the module to run, e.g. `python -m {module}.train`")
            return main
        following = f"{name}.{parts[index]}"
        if locations is None:
            raise UsageError(f"module {module!r} not found: {name!r} is a module, not a package, so it holds no "
                             f"{parts[index]!r}")
        spec = importlib.machinery.PathFinder.find_spec(following, list(locations))
        if spec is None:
            raise UsageError(f"module {module!r} not found: package {name!r} ({list(locations)[0]}) has no "
                             f"{parts[index]!r}")


def is_python_interpreter(name: str) -> bool:
    """True for `python`, `python3`, `python3.11`, `pypy3` and paths to them."""
    return bool(_PYTHON_NAME.match(os.path.basename(name)))


def _parse_interpreter_args(interpreter: str, rest: Sequence[str]) -> PythonCommand:
    """The program after `interpreter`'s own options."""
    options: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "-m" or arg.startswith("-m"):
            module, i = (rest[i + 1] if i + 1 < len(rest) else "", i + 2) if arg == "-m" else (arg[2:], i + 1)
            if not module:
                raise UsageError(f"`{interpreter} -m` names no module: give `{interpreter} -m pkg.module ARGS`")
            if module in LAUNCHER_MODULES:
                name = LAUNCHER_MODULES[module]
                return launched(parse_launcher(name, rest[i:], _launched_program(name)), interpreter, tuple(options))
            return PythonCommand(module=module, args=tuple(rest[i:]), interpreter=interpreter, interpreter_args=tuple(options))
        if arg == "-" or not arg.startswith("-"):
            return _script(interpreter, arg, rest[i + 1:], options)
        taken = _interpreter_option(interpreter, arg, rest[i + 1] if i + 1 < len(rest) else None)
        options += [arg] if taken == 1 else [arg, rest[i + 1]]
        i += taken
    raise UsageError(f"`{shlex.join([interpreter, *rest])}` runs no program: give a script (`{interpreter} train.py`) "
                     f"or a module (`{interpreter} -m pkg.module`)")


def _script(interpreter: str, script: str, args: Sequence[str], options: list[str]) -> PythonCommand:
    if script == "-":
        raise UsageError(f"`{interpreter} -` reads the program from stdin; put it in a file and give its path")
    return PythonCommand(script=script, args=tuple(args), interpreter=interpreter, interpreter_args=tuple(options))


def _interpreter_option(interpreter: str, arg: str, following: str | None) -> int:
    """How many arguments interpreter option `arg` takes up (1 or 2); UsageError for one torchpace
    cannot run with."""
    if arg.startswith("--") or arg[1:2] in ("c", "h", "V", "i"):
        raise UsageError(f"`{interpreter} {arg}` is not supported here: torchpace runs a script file or a module "
                         f"(`{interpreter} train.py`, `{interpreter} -m pkg.module`)")
    for position, letter in enumerate(arg[1:], start=1):
        if letter in _HOOK_BREAKERS:
            raise UsageError(f"`{interpreter} {arg}`: {_HOOK_BREAKERS[letter]}; drop it")
        if letter in _VALUED:
            if position < len(arg) - 1:
                return 1
            if following is None:
                raise UsageError(f"`{interpreter} {arg}` needs a value (e.g. `-X dev`, `-W error`)")
            return 2
        if letter not in _FLAGS:
            raise UsageError(f"`{interpreter} {arg}`: unknown interpreter option -{letter}")
    return 1
