"""Render a LaunchPlan: the `--dry-run` text and JSON, and the one-line summary before a launch."""

from __future__ import annotations

import shlex
from typing import Any, Mapping

from torchpace.launch.plan import LaunchPlan, Setting


def env_diff(base_env: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str | None]:
    """Vars that `env` adds or changes over `base_env` (None: removed), in name order."""
    names = sorted(set(base_env) | set(env))
    return {n: env.get(n) for n in names if base_env.get(n) != env.get(n)}


def render_plan(plan: LaunchPlan, base_env: Mapping[str, str]) -> str:
    """The dry-run text: the exact command, the env diff with sources, every setting, the notes."""
    sections = ["command (dry run: nothing was started):", f"  {shlex.join(plan.argv)}", ""]
    sections += _render_env_diff(plan, base_env)
    sections += ["", "settings (source: cli > env > config > auto > default):"]
    sections += _table([(s.name, _shown(s.value), s.source.value, s.reason) for s in plan.settings])
    if plan.notes:
        sections += ["", "notes:", *(f"  - {note}" for note in plan.notes)]
    return "\n".join(sections) + "\n"


def _render_env_diff(plan: LaunchPlan, base_env: Mapping[str, str]) -> list[str]:
    diff = env_diff(base_env, plan.env)
    if not diff:
        return ["environment: unchanged"]
    by_name = {s.name: s for s in plan.settings}
    rows = []
    for name, value in diff.items():
        setting = by_name.get(name)
        entry = f"{name}={value}" if value is not None else f"unset {name}"
        rows.append((entry, setting.source.value if setting else "", setting.reason if setting else ""))
    return ["environment changes (the child's only; torchpace's own environment is untouched):", *_table(rows)]


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as aligned columns (the last column is free text)."""
    if not rows:
        return []
    widths = [min(max(len(row[i]) for row in rows), 48) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]).rstrip() for row in rows]


def _shown(value: str | None) -> str:
    return "-" if value is None else value


def plan_to_dict(plan: LaunchPlan, base_env: Mapping[str, str]) -> dict[str, Any]:
    """The plan as JSON-able data (`--dry-run --json`)."""
    return {
        "argv": list(plan.argv),
        "command": shlex.join(plan.argv),
        "env_changes": env_diff(base_env, plan.env),
        "settings": [_setting_dict(s) for s in plan.settings],
        "rlimit_nofile": plan.nofile,
        "bindings": [{"local_rank": b.local_rank, "node": b.node, "cpus": list(b.cpus)} for b in plan.bindings],
        "needs_prepare": list(plan.needs_prepare),
        "notes": list(plan.notes),
    }


def _setting_dict(setting: Setting) -> dict[str, Any]:
    return {"name": setting.name, "value": setting.value, "source": setting.source.value, "reason": setting.reason}


def render_summary(plan: LaunchPlan, base_env: Mapping[str, str]) -> str:
    """One line before the launch: what the child's env gets, then the notes."""
    changes = ", ".join(f"{name}={_short(value)}" for name, value in env_diff(base_env, plan.env).items())
    lines = [f"torchpace launch: {plan.setting('launcher').reason}; env: {changes or 'unchanged'}"]
    lines += [f"torchpace launch: note: {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"


def _short(value: str | None, width: int = 60) -> str:
    if value is None:
        return "(unset)"
    return value if len(value) <= width else value[: width - 3] + "..."
