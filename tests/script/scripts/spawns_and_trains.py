"""Fixture: a training script that starts two processes of its own before it trains: one in its own
process group (a helper it leaves to run) and one in a session of its own (as a daemon or a server
would be). It writes the pids of all three to argv[1] at its first step, then trains argv[2] steps
(default: for ever, slowly enough for a signal to find it mid-run)."""

import json
import os
import subprocess
import sys
import time

import torch

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
helper = subprocess.Popen(SLEEPER)
daemon = subprocess.Popen(SLEEPER, start_new_session=True)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10**9
for step in range(steps):
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    if step == 0:
        tmp = sys.argv[1] + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"script": os.getpid(), "helper": helper.pid, "daemon": daemon.pid}, f)
        os.replace(tmp, sys.argv[1])
    time.sleep(0.01)
