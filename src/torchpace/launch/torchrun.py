"""`python -m torchpace.launch.torchrun ARGS...`: torchrun whose exit code is the script's.

torch.distributed.run exits with 1 whenever a worker fails, whatever the worker's own exit code. This
runs the same `main` and, when a worker failed, prints one line per failed rank (in place of torchrun's
failure table, so the workers' own last stderr lines stay at the end) and exits with the exit code of
the first rank that failed (128 + N for signal N). A signal that stopped torchrun itself
(SIGINT, SIGTERM, SIGHUP, after it shut its workers down) gives 128 + that signal.
"""

from __future__ import annotations

import re
import sys

from torchpace.process import exit_code


def main(argv: list[str]) -> int:
    """Run torchrun with `argv`; return the exit status described in the module docstring."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as err:
        sys.stderr.write(render_failures(err))
        _, failure = err.get_first_failure()
        return exit_code(failure.exitcode) or 1
    except SignalException as err:
        return 128 + int(err.sigval)
    return 0


def render_failures(err) -> str:
    """One line per failed rank of a ChildFailedError, the first failure marked."""
    first, _ = err.get_first_failure()
    lines = []
    for rank, failure in sorted(err.failures.items()):
        how = f"signal {-failure.exitcode}" if failure.exitcode < 0 else f"exit code {failure.exitcode}"
        mark = " (the first to fail)" if rank == first else ""
        lines.append(f"torchrun: rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) ended with {how}{mark}\n")
    return "".join(lines)


_FAILURE_LINE = re.compile(r"^torchrun: rank (\d+) \(local rank \d+, pid \d+\) ended with (signal|exit code) (-?\d+)", re.M)


def parse_failures(text: str) -> dict[int, int]:
    """rank -> exit code (negative for a signal) from the lines `render_failures` wrote into `text`."""
    return {int(rank): (-int(n) if kind == "signal" else int(n)) for rank, kind, n in _FAILURE_LINE.findall(text)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
