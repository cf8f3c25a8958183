"""A launched test worker that fails on purpose: `exit_with.py CODE [RANK]` prints a marker line on
stderr and exits with CODE (only on rank RANK when given; other ranks exit 0). CODE `kill` makes
the process kill itself with SIGKILL."""

import os
import signal
import sys

code, only_rank = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
if only_rank is None or os.environ.get("RANK") == only_rank:
    print(f"marker: rank {os.environ.get('RANK', '0')} fails with {code}", file=sys.stderr, flush=True)
    if code == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(code))
