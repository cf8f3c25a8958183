"""Launchers after `--`: `torchrun ARGS train.py`, `python -m torch.distributed.run ARGS train.py`, `accelerate
launch ARGS train.py`. Each starts the training program once per rank; torchpace runs the launcher as the
user wrote it (its options untouched) with the interpreter torchpace runs in, and its hook reaches every
rank through the environment the launcher passes on.

`parse_launcher` reads a launcher's command line with the launcher's own argument parser (torchrun's
`get_args_parser`, accelerate's `launch_command_parser`), so every spelling and option it accepts is read as
it reads it, and returns a `Launcher`: its options as given, the program each rank runs (a `PythonCommand`),
and the ranks it starts on this node when its options say (None: decided when it runs, e.g. `gpu`). Scripts
that start their own ranks (`torch.multiprocessing.spawn`, Lightning's DDP launcher) need no launcher: the
hook finds their ranks when they run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from torchpace.errors import UsageError

PythonCommand = Any  # a `torchpace.launch.command.PythonCommand` (that module reads the program; this one the launcher)

TORCHRUN = "torchrun"
ACCELERATE = "accelerate launch"
LEGACY_LAUNCH = "torch.distributed.launch"
# the module each launcher runs as, under torchpace's interpreter: torchrun through torchpace's wrapper of its
# `main` (the same launcher, whose exit code is the failed rank's: `torchpace.launch.torchrun`)
RUN_MODULE = {TORCHRUN: "torchpace.launch.torchrun", ACCELERATE: "accelerate.commands.launch",
              LEGACY_LAUNCH: "torch.distributed.launch"}
# `python -m MODULE` of a launcher, as the user may give it
LAUNCHER_MODULES = {"torch.distributed.run": TORCHRUN, "torch.distributed.launch": LEGACY_LAUNCH,
                    "accelerate.commands.launch": ACCELERATE, "torchpace.launch.torchrun": TORCHRUN}
# the option that sets how many ranks a launcher starts on this node, as `with_ranks` writes it
_RANKS_OPTION = {TORCHRUN: "--nproc-per-node", LEGACY_LAUNCH: "--nproc-per-node", ACCELERATE: "--num_processes"}


@dataclass(frozen=True)
class Launcher:
    """A launcher command: how it starts the ranks, and what each rank runs.

    Attributes:
        name: `torchrun`, `accelerate launch` or `torch.distributed.launch`.
        args: the launcher's own options, as the user wrote them (before the program).
        program: what each rank runs.
        ranks_per_node: the processes it starts on this node, where its options say (None: it decides when it
            runs: `--nproc-per-node gpu`, accelerate's config file).
        nnodes: the nodes its options name (1 when they name none; the largest of a range `1:4`).
        master_port: the TCP port its rendezvous listens on when its options fix one on this host (None: it
            picks a free one, `--standalone`, or the rendezvous is elsewhere).
        words: the program as the launcher takes it, after its options (`train.py ARGS`, `pkg.train ARGS` after
            `-m`), a Python interpreter given with `--no-python` replaced by torchpace's.
    """

    name: str
    args: tuple[str, ...]
    program: PythonCommand
    words: tuple[str, ...] = ()
    ranks_per_node: int | None = None
    nnodes: int = 1
    master_port: int | None = None

    @property
    def module(self) -> str:
        """The module torchpace runs the launcher as (`python -m MODULE ARGS PROGRAM`)."""
        return RUN_MODULE[self.name]

    @property
    def world_size(self) -> int | None:
        """Ranks in the whole job, where the options say (None: decided when it runs)."""
        return None if self.ranks_per_node is None else self.ranks_per_node * self.nnodes

    def argv_tail(self) -> list[str]:
        """The launcher's arguments: its options, then the program (as the launcher takes it)."""
        return [*self.args, *self.words]

    def with_ranks(self, ranks: int) -> "Launcher":
        """The same launcher starting `ranks` processes on this node (`bench --scaling`): its ranks option
        replaced (or added), every other option as given."""
        option = _RANKS_OPTION[self.name]
        body = option[2:]
        spellings = {f"--{body.replace('_', '-')}", f"--{body.replace('-', '_')}"}
        args, skip = [], False
        for arg in self.args:
            if skip:
                skip = False
                continue
            name = arg.split("=", 1)[0]
            if name in spellings:
                skip = "=" not in arg
                continue
            args.append(arg)
        return replace(self, args=(f"{option}={ranks}", *args), ranks_per_node=ranks)

    def label(self) -> str:
        """How messages name it: `torchrun train.py`."""
        return f"{self.name} {self.program.label}"


def launcher_of(argv: Sequence[str]) -> str | None:
    """The launcher `argv` starts (`torchrun`, `accelerate launch`), or None for any other command."""
    if not argv:
        return None
    first = os.path.basename(argv[0])
    if first == "torchrun":
        return TORCHRUN
    if first == "accelerate" and len(argv) > 1 and argv[1] == "launch":
        return ACCELERATE
    if first == "accelerate-launch":
        return ACCELERATE
    return None


def launcher_words(argv: Sequence[str]) -> int:
    """How many words of `argv` name the launcher itself (`torchrun`: 1, `accelerate launch`: 2)."""
    return 2 if os.path.basename(argv[0]) == "accelerate" else 1


# (the launcher's parsed options, the program's first word, its arguments) -> the program each rank runs
ProgramOf = Callable[[argparse.Namespace, str, list], PythonCommand]


def parse_launcher(name: str, args: Sequence[str], program_of: ProgramOf) -> Launcher:
    """The `Launcher` of launcher `name` given `args` (its options, the program and the program's arguments);
    `program_of` reads the program each rank runs (`torchpace.launch.command` gives it, as the one reader of a
    Python program).

    Raises:
        UsageError: an option the launcher refuses, no program to run, a launcher that is not installed in the
            environment torchpace runs in, or a program that is not Python (`--no-python ./run.sh`).
    """
    parser = _parser(name)
    with _usage_errors(name, args):
        parsed = parser.parse_args(list(args))
    script, rest = parsed.training_script, list(parsed.training_script_args or [])
    if not script:
        raise UsageError(f"`{name} {shlex.join(args)}` names no training program: give it the script "
                         f"(`{name} ... train.py ARGS`)")
    options = tuple(args[:len(args) - 1 - len(rest)])
    program = program_of(parsed, script, rest)
    # the interpreter a `--no-python` program names is torchpace's, as for every program it runs
    words = (sys.executable, *rest) if getattr(parsed, "no_python", False) and program.interpreter else (script, *rest)
    if name == ACCELERATE:
        ranks = parsed.num_processes
        nnodes = parsed.num_machines or 1
        ranks = None if ranks is None else max(1, ranks // nnodes)
        port = parsed.main_process_port if nnodes == 1 else None
    else:
        ranks = _torchrun_ranks(parsed.nproc_per_node)
        nnodes = _torchrun_nodes(parsed.nnodes)
        port = None if parsed.standalone or nnodes > 1 else _torchrun_port(parsed)
    return Launcher(name, options, program, words, ranks, nnodes, port)


def _parser(name: str) -> argparse.ArgumentParser:
    """The launcher's own argument parser, as installed in this environment."""
    if name == ACCELERATE:
        try:
            from accelerate.commands.launch import launch_command_parser
        except ImportError as err:
            raise UsageError("`accelerate launch` needs accelerate in the environment torchpace runs in "
                             f"({err}): pip install accelerate") from err
        return launch_command_parser()
    try:  # torch: torchrun's own parser
        from torch.distributed.run import get_args_parser
    except ImportError as err:
        raise UsageError(f"{name} needs torch.distributed, which this torch build lacks ({err})") from err
    parser = get_args_parser()
    if name == LEGACY_LAUNCH:  # torch.distributed.launch takes torchrun's options and --use-env
        parser.add_argument("--use-env", "--use_env", default=False, action="store_true")
    return parser


@contextlib.contextmanager
def _usage_errors(name: str, args: Sequence[str]):
    """An argparse error of the launcher's parser as a UsageError naming the launcher and what it said."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            yield
    except SystemExit as exit_:
        text = said.getvalue().strip().splitlines()
        why = text[-1].split("error: ", 1)[-1] if text else f"exit status {exit_.code}"
        raise UsageError(f"`{name} {shlex.join(args)}`: {name} refused its options ({why}); see `{name} --help`") from None


def _torchrun_ranks(value: str | int | None) -> int | None:
    """torchrun's `--nproc-per-node` as a number of processes (None: `gpu`, `auto`, `xpu`: decided when it runs)."""
    if value is None:
        return 1
    text = str(value)
    return int(text) if text.isdigit() and int(text) >= 1 else None


def _torchrun_nodes(value: str | None) -> int:
    """torchrun's `--nnodes` (`2`, or the largest of a range `1:4`)."""
    text = str(value or "1")
    last = text.split(":")[-1]
    return int(last) if last.isdigit() and int(last) >= 1 else 1


def _torchrun_port(parsed: argparse.Namespace) -> int | None:
    """The port of a one-node torchrun's rendezvous when its options fix one on this host."""
    endpoint = getattr(parsed, "rdzv_endpoint", "") or ""
    host, _, port = endpoint.rpartition(":")
    if endpoint and port.isdigit() and host in ("", "localhost", "127.0.0.1", "::1", "[::1]"):
        return int(port)
    if not endpoint:
        return int(parsed.master_port) if getattr(parsed, "master_port", None) else None
    return None
