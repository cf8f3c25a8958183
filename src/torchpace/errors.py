"""Errors that carry their exit code: 2 for bad input (usage), 1 for a failure in the user's code.

The CLI turns these into a message on stderr and the exit code; nothing else in torchpace exits.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def whole_number_in(value: object, least: int, most: int | None = None) -> bool:
    """Whether `value` is an int (not a bool, which Python counts as one) from `least` to `most` (no upper
    bound when None): the one test behind every "a whole number from A to B" usage check."""
    return (isinstance(value, int) and not isinstance(value, bool) and value >= least
            and (most is None or value <= most))


class TorchpaceError(Exception):
    """Base class; `exit_code` is what the CLI returns."""

    exit_code = EXIT_FAILURE


class UsageError(TorchpaceError):
    """Bad input from the user: a spec, knob, value or file that is not valid. Exit 2."""

    exit_code = EXIT_USAGE


class UserCodeError(TorchpaceError):
    """An exception raised inside the user's workload code. Exit 1, with their traceback.

    Attributes:
        where: what torchpace was doing when the user's code raised (e.g. "building workload 'x'").
        user_traceback: the formatted traceback of the user's exception.
    """

    exit_code = EXIT_FAILURE

    def __init__(self, where: str, user_traceback: str):
        super().__init__(f"the workload's own code raised while {where}")
        self.where = where
        self.user_traceback = user_traceback


class ScriptFailed(UserCodeError):
    """Script mode: the user's own script failed, never stepped, or ended too early. Exit 1, with the
    tail of its output (stdout and stderr as they came) in place of a traceback (it ran in its own process)."""

    def __init__(self, message: str, stderr_tail: str):
        TorchpaceError.__init__(self, message)
        self.where = message
        self.user_traceback = stderr_tail or "(the script printed nothing)"



class HookFailed(TorchpaceError):
    """Script mode: torchpace's own hook raised inside the script's process (torchpace's failure, not the
    script's). Exit 1; the message holds torchpace's traceback as the hook printed it."""
