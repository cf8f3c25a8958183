"""A launched test worker that waits to be signalled: `sleeper.py OUT_DIR [--ignore-term]` starts a
grandchild that sleeps too, writes both pids to OUT_DIR/pids-<RANK>.txt and sleeps (ignoring SIGTERM
with --ignore-term, as a hung script would)."""

import os
import signal
import subprocess
import sys
import time

if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
path = os.path.join(sys.argv[1], f"pids-{os.environ.get('RANK', '0')}.txt")
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}\n")
os.replace(path + ".tmp", path)
time.sleep(120)
