"""torchpace's log records: what a maintainer asks for when a user reports a problem.

Every module logs to `logging.getLogger(__name__)`, a child of the `torchpace` logger: INFO for what
happened (a trial started and ended, the study storage opened, a config loaded, a decision taken),
DEBUG for the detail behind it (a child's argv and the environment torchpace planned for it).
Results, progress and errors meant for the user are not log records: they are printed as before.

The package configures nothing: importing torchpace adds no handler and leaves the root logger
alone, so an application that embeds torchpace chooses what it sees
(`logging.getLogger("torchpace").setLevel(logging.DEBUG)` and a handler of its own). The `torchpace`
command is the one place that attaches a handler (`attach_cli_handler`, from `cli/__init__.py`):
`-v` shows the debug and info records on stderr, `-q` only errors, and by default warnings and errors.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Callable, Mapping

LOGGER_NAME = "torchpace"
_FORMAT = "torchpace %(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
_DATE_FORMAT = "%H:%M:%S"


class EnvChanges:
    """A child's environment as the changes from this process's: `NAME=value` for each variable set
    or changed, `-NAME` for each removed. Computed only when a record is written (`str()`), so a
    record at a level nobody shows costs nothing. Only what torchpace planned differs: a variable
    of the user's that the child inherits as it is never appears."""

    def __init__(self, env: Mapping[str, str] | None, base: Mapping[str, str] | None = None):
        self.env, self.base = env, base

    def __str__(self) -> str:
        if self.env is None:
            return "none (inherited)"
        base = os.environ if self.base is None else self.base
        changed = [f"{name}={value}" for name, value in sorted(self.env.items()) if base.get(name) != value]
        removed = [f"-{name}" for name in sorted(base) if name not in self.env]
        return " ".join(changed + removed) or "none"


class _StderrHandler(logging.StreamHandler):
    """Writes each record to whatever `sys.stderr` is when the record is written: a Rich live display
    redirects stderr while it runs, so a record lands above the progress bar, not through it."""

    def __init__(self, level: int) -> None:
        logging.Handler.__init__(self, level)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr


def cli_level(verbose: bool, quiet: bool) -> int:
    """The level of the records the command shows: DEBUG with `-v`, ERROR with `-q`, else WARNING."""
    return logging.DEBUG if verbose else logging.ERROR if quiet else logging.WARNING


def cli_flags() -> list[str]:
    """The `-v`/`-q` that give a torchpace command started from this one (a rank of `profile` under
    torchrun) the log this one shows."""
    level = logging.getLogger(LOGGER_NAME).getEffectiveLevel()
    return ["-v"] if level <= logging.DEBUG else ["-q"] if level >= logging.ERROR else []


def attach_cli_handler(level: int) -> Callable[[], None]:
    """Show the `torchpace` logger's records of `level` and above on stderr; returns the function that
    puts the logger back as it was (the command calls it when it ends, so a caller of `main()` in a
    longer-lived process keeps its own logging set-up)."""
    logger = logging.getLogger(LOGGER_NAME)
    handler = _StderrHandler(level)
    handler.setFormatter(logging.Formatter(_FORMAT, _DATE_FORMAT))
    before = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # shown once, here, even where the root logger has handlers of its own

    def detach() -> None:
        logger.removeHandler(handler)
        logger.setLevel(before[0])
        logger.propagate = before[1]

    return detach
