"""Render a LaunchPlan: the `--dry-run` text and JSON, and the one-line summary before a launch."""

from __future__ import annotations

import shlex
from typing import Any, Mapping

from torchpace.launch.plan import LaunchPlan, Setting

_VALUE_WIDTH = 32  # longer values are cut in the settings table; the env diff shows them in full
_SUMMARY_WIDTH = 60


def env_diff(base_env: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str | None]:
    """Vars that `env` adds or changes over `base_env` (None: removed), in name order."""
    names = sorted(set(base_env) | set(env))
    return {n: env.get(n) for n in names if base_env.get(n) != env.get(n)}


def render_plan(plan: LaunchPlan, base_env: Mapping[str, str]) -> str:
    """The dry-run text: the exact command, the env diff with sources, every setting, the notes."""
    sections = ["command (dry run: nothing was started):", f"  {shlex.join(plan.argv)}", ""]
    sections += _render_env_diff(plan, base_env)
    sections += ["", "settings (source: cli > env > config > auto > default):"]
    sections += _table([(s.name, _short(s.value, _VALUE_WIDTH), s.source.value, s.reason) for s in plan.settings])
    if plan.notes:
        sections += ["", "notes:", *(f"  - {note}" for note in plan.notes)]
    return "\n".join(sections) + "\n"


def _render_env_diff(plan: LaunchPlan, base_env: Mapping[str, str]) -> list[str]:
    """Each changed variable in full, with its source and reason on the line below."""
    diff = env_diff(base_env, plan.env)
    if not diff:
        return ["environment: unchanged"]
    by_name = {s.name: s for s in plan.settings}
    lines = ["environment changes for the script (torchpace's own environment is untouched):"]
    for name, value in diff.items():
        lines.append(f"  {name}={value}" if value is not None else f"  unset {name}")
        if name in by_name:
            lines.append(f"      {by_name[name].source.value}: {by_name[name].reason}")
    return lines


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as aligned columns (the last column is free text)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)] if rows else []
    return ["  " + "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]).rstrip() for row in rows]


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
    changes = ", ".join(f"{name}={_short(value, _SUMMARY_WIDTH)}" for name, value in env_diff(base_env, plan.env).items())
    lines = [f"torchpace launch: {plan.setting('launcher').reason}; env: {changes or 'unchanged'}"]
    lines += [f"torchpace launch: note: {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"


def _short(value: str | None, width: int) -> str:
    """`value` cut to `width` characters; "-" for nothing set."""
    if value is None:
        return "-"
    return value if len(value) <= width else value[: width - 3] + "..."
