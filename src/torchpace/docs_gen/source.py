"""Facts read from torchpace's own source: named constants with their reasons, and where a symbol lives.

The reference pages quote thresholds as the code writes them (`_NOFILE_FLOOR = 1024  # reason`), so
they are read from the module's source with `ast` and `tokenize` rather than copied by hand.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

import torchpace
from torchpace.records import docstring_attributes

_CONSTANT_NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
_PACKAGE_DIR = Path(torchpace.__file__).resolve().parent


@dataclass(frozen=True)
class Constant:
    """A module-level named constant.

    Attributes:
        name: the name, e.g. ``_NOFILE_FLOOR``.
        expression: its value as written in the source, e.g. ``1 << 30``.
        reason: the comment on its line (the one-line reason the style asks for), or "".
    """

    name: str
    expression: str
    reason: str


@functools.lru_cache(maxsize=None)
def _parsed(module_name: str) -> tuple[str, ast.Module, dict[int, str]]:
    """The module's source, its syntax tree, and its comments by line number."""
    module = importlib.import_module(module_name)
    source = inspect.getsource(module)
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    return source, ast.parse(source), comments


def module_constants(module: ModuleType) -> dict[str, Constant]:
    """Every module-level ``NAME = value`` (upper-case name) of `module`, in source order."""
    return dict(_module_constants(module.__name__))


@functools.lru_cache(maxsize=None)
def _module_constants(module_name: str) -> tuple[tuple[str, Constant], ...]:
    source, tree, comments = _parsed(module_name)
    lines = [line.encode() for line in source.splitlines(keepends=True)]
    found = []
    for node in tree.body:
        target = _assigned_name(node)
        if target and _CONSTANT_NAME.match(target):
            expression = " ".join(_segment(lines, node.value).split())
            found.append((target, Constant(target, expression, comments.get(node.end_lineno, ""))))
    return tuple(found)


def _segment(lines: list[bytes], node: ast.expr) -> str:
    """The source text of `node` (ast offsets count UTF-8 bytes; lines are 1-based)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset].decode()
    middle = b"".join(lines[first + 1:last])
    return (lines[first][node.col_offset:] + middle + lines[last][:node.end_col_offset]).decode()


def _assigned_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id
    return None


def _top_level(module: ModuleType) -> dict[str, ast.AST]:
    """Module-level functions and classes of `module` by name."""
    _, tree, _ = _parsed(module.__name__)
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def names_used(module: ModuleType, symbol: str) -> set[str]:
    """Names that `symbol` (a function or class of `module`) reads, following the module's own
    functions and classes it calls, so a check's thresholds include those of its helpers."""
    definitions = _top_level(module)
    seen: set[str] = set()
    pending = [symbol]
    used: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        for node in ast.walk(definitions[name]):
            if isinstance(node, ast.Name):
                used.add(node.id)
                pending.append(node.id)
    return used


def constants_used(module: ModuleType, symbol: str) -> list[Constant]:
    """The named constants of `module` that `symbol` reads (directly or through helpers), in source order."""
    used = names_used(module, symbol)
    return [constant for name, constant in module_constants(module).items() if name in used]


def call_arguments(module: ModuleType, symbol: str, callee: str, position: int | str) -> list[str]:
    """The string passed at `position` to every call of `callee` inside `symbol`, in source order.

    An f-string comes back with its fields as ``<name>`` (``f"doctor.probe.{name}"`` ->
    ``doctor.probe.<name>``); a keyword argument is found when `position` names it.
    """
    calls = sorted((node for node in ast.walk(_top_level(module)[symbol])
                    if isinstance(node, ast.Call) and _callee_name(node.func) == callee),
                   key=lambda node: (node.lineno, node.col_offset))
    arguments = (_argument(call, position) for call in calls)
    return unique(text for text in map(_literal_text_or_none, arguments) if text is not None)


def _literal_text_or_none(node: ast.expr | None) -> str | None:
    return _literal_text(node) if node is not None else None


def _callee_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _argument(call: ast.Call, position: int | str) -> ast.expr | None:
    if isinstance(position, str):
        return next((kw.value for kw in call.keywords if kw.arg == position), None)
    return call.args[position] if len(call.args) > position else None


def _literal_text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else f"<{_field_name(part.value)}>"
                       for part in node.values)
    return None


def _field_name(node: ast.expr) -> str:
    """A readable stand-in for an f-string field: its variable or attribute name, else an ellipsis."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else "…"


def location(obj: Any) -> str:
    """Where `obj` (a class or function) is defined: its file relative to the package and its name,
    e.g. ``knobs/compute.py`` ``AmpKnob``. No line numbers, so an edit elsewhere does not move it."""
    path = Path(inspect.getsourcefile(obj)).resolve().relative_to(_PACKAGE_DIR)
    return f"`{path.as_posix()}` `{obj.__qualname__}`"


def first_line(doc: str | None) -> str:
    """The first sentence-line of a docstring, or ""."""
    return inspect.cleandoc(doc).splitlines()[0].strip().replace("``", "`") if doc else ""


def unique(items: Iterable[str]) -> list[str]:
    """`items` without repeats, in first-seen order."""
    return list(dict.fromkeys(items))


def returned_strings(cls: type, methods: Iterable[str]) -> list[str]:
    """The literal strings `cls`'s own `methods` return (a knob's reasons for not applying), in order."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    wanted = set(methods)
    found: list[str] = []
    for node in ast.walk(tree.body[0]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in wanted:
            for ret in ast.walk(node):
                text = _literal_text(ret.value) if isinstance(ret, ast.Return) and ret.value is not None else None
                if text:
                    found.append(text)
    return unique(found)


def field_notes(cls: type) -> dict[str, str]:
    """What each field of dataclass `cls` means: its Google-style ``Attributes:`` entry, else the
    comment on its line."""
    notes = dict(docstring_attributes(cls.__doc__ or ""))
    _, _, comments = _parsed(cls.__module__)
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    first_line_no = inspect.getsourcelines(cls)[1]
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id not in notes:
            comment = comments.get(first_line_no + node.lineno - 1, "")
            if comment:
                notes[node.target.id] = comment
    return notes

