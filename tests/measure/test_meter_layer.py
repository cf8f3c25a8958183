"""measure/ is the meter: importing any of its modules loads nothing that prepares a workload, starts a
trial or plans a child (those sit above it and call it)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import torchpace.measure

ABOVE_THE_METER = ("torchpace.runtime", "torchpace.trial", "torchpace.tune", "torchpace.script", "torchpace.launch",
                   "torchpace.bench", "torchpace.config", "torchpace.workload", "torchpace.knobs", "torchpace.inference")


def test_no_meter_module_loads_what_runs_a_workload():
    modules = [f"torchpace.measure.{m.name}" for m in pkgutil.iter_modules(torchpace.measure.__path__)]
    assert {"torchpace.measure.timing", "torchpace.measure.latency", "torchpace.measure.bench"} <= set(modules)
    code = ("import importlib, sys\n"
            f"for name in {modules!r}: importlib.import_module(name)\n"
            f"print(sorted(m for m in sys.modules if m.startswith({ABOVE_THE_METER!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", f"the meter loads modules above it: {done.stdout}"
