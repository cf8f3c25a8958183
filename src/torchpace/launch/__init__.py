"""`torchpace launch`: plan (pure) -> execute, as docs/design.md#launch describes.

`plan_child` turns a config, host facts, the caller's environment and options into a `LaunchPlan`
(argv, the child's env, and every setting's value, source and reason), for launches and trials alike;
`torchpace.launch.execute.execute` runs it (not re-exported here: the name is also its module's). The names below are imported lazily, so the
per-rank entrypoint (`python -m torchpace.launch.bind`) and the sitecustomize hook stay light; nothing
here imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "plan_child": "torchpace.launch.plan",
    "LaunchPlan": "torchpace.launch.plan",
    "ChildOptions": "torchpace.launch.plan",
    "PythonCommand": "torchpace.launch.command",
    "parse_python_command": "torchpace.launch.command",
    "LaunchFacts": "torchpace.launch.plan",
    "Setting": "torchpace.launch.plan",
    "Source": "torchpace.launch.plan",
    "RankBinding": "torchpace.launch.plan",
    "probe_launch_facts": "torchpace.launch.probe",
    "probe_launch_host": "torchpace.launch.probe",
    "render_plan": "torchpace.launch.render",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'torchpace.launch' has no attribute {name!r}")
