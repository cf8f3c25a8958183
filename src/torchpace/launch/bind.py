"""`python -m torchpace.launch.bind CMD ARGS...`: run CMD under this local rank's NUMA binding.

torchrun starts one of these per rank (`--no-python`); it reads the rank's numactl command and CPU
list from TORCHPACE_LAUNCH_BINDINGS (written by the planner), then execs `numactl ... CMD ARGS`, so the
script keeps this process's pid and torchrun sees its exit code. Imports neither torch nor torchpace's
heavier modules.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Mapping

BINDINGS_ENV = "TORCHPACE_LAUNCH_BINDINGS"  # the planner's name for it (torchpace.launch.plan)


def build_rank_command(command: list[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv, env) for this rank: its numactl prefix before `command`; env vars the user set win."""
    bindings = json.loads(env[BINDINGS_ENV])
    rank = env.get("LOCAL_RANK", "0")
    if rank not in bindings:
        raise SystemExit(f"torchpace.launch.bind: no NUMA binding planned for local rank {rank}")
    entry = bindings[rank]
    child_env = {k: v for k, v in env.items() if k != BINDINGS_ENV}
    for name, value in entry["env"].items():
        child_env.setdefault(name, value)
    return [*entry["prefix"], *command], child_env


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m torchpace.launch.bind CMD [ARGS...]")
    command, env = build_rank_command(argv, os.environ)
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main(sys.argv[1:])
