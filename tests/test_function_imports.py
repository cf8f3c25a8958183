"""Imports inside functions (docs/architecture.md#imports-inside-functions): each one either loads torch
(torch itself, or a torchpace module that imports torch at its top), imports an optional dependency (not
in [project].dependencies), or says why it is not at the top in a comment on its line or on the line
above its group of imports. Everything else is imported at the top, where the layers contract and a
reader see it."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "torchpace"


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _absolute(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules `node` may load: its module and, for `from X import a`, `X.a` when that is a module."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        keep = len(parts) - node.level + (MODULES[module].name == "__init__.py")
        base = ".".join(parts[:keep] + ([base] if base else []))
    lazy = _lazy_names(base)
    return [base, *(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES),
            *(lazy[alias.name] for alias in node.names if alias.name in lazy)]


@functools.cache
def _lazy_names(package: str) -> dict[str, str]:
    """name -> module for a package that imports its names on first use (`_LAZY` or `_SOURCES`, read
    by its `__getattr__`): `from package import name` loads that module."""
    if package not in MODULES:
        return {}
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) \
                and any(isinstance(t, ast.Name) and t.id in ("_LAZY", "_SOURCES") for t in node.targets):
            pairs = zip(node.value.keys, node.value.values)
            return {k.value: v.value if v.value in MODULES else f"{package}.{v.value}" for k, v in pairs
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


@functools.cache
def _top_level_imports(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text())
    return [name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) for name in _absolute(module, node)]


def _loads_torch(module: str, seen: dict[str, bool]) -> bool:
    """Whether importing torchpace `module` imports torch: through its top-level imports or its parents'."""
    if module not in seen:
        seen[module] = False  # an import cycle adds nothing
        parts = module.split(".")
        names = _top_level_imports(module) + [".".join(parts[:i]) for i in range(2, len(parts))]
        seen[module] = any(name.split(".")[0] == "torch" or (name in MODULES and _loads_torch(name, seen))
                           for name in names)
    return seen[module]


def _required_roots() -> set[str]:
    """The import names of [project].dependencies."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower().replace("_", "-") for dep in deps}
    return {name for name, dists in importlib.metadata.packages_distributions().items()
            if any(d.lower().replace("_", "-") in wanted for d in dists)} | {"torchpace"}


def _has_reason(lines: list[str], node: ast.stmt, body: list[ast.stmt]) -> bool:
    if any("#" in lines[i] for i in range(node.lineno - 1, node.end_lineno)):
        return True
    first = node  # the first import of the consecutive group `node` belongs to
    index = body.index(node)
    while index > 0 and isinstance(body[index - 1], (ast.Import, ast.ImportFrom)) \
            and body[index - 1].end_lineno == first.lineno - 1:
        index -= 1
        first = body[index]
    return lines[first.lineno - 2].strip().startswith("#")


def unexplained_imports() -> list[str]:
    required, torchy = _required_roots(), {}
    found = []
    for module, path in sorted(MODULES.items()):
        text = path.read_text()
        lines = text.splitlines()
        for holder in ast.walk(ast.parse(text)):
            for field in ("body", "orelse", "finalbody"):
                body = getattr(holder, field, None)
                if not isinstance(body, list) or not _inside_function(holder, text):
                    continue
                for node in body:
                    if not isinstance(node, (ast.Import, ast.ImportFrom)) or _allowed(module, node, required, torchy):
                        continue
                    if not _has_reason(lines, node, body):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


_FUNCTION_SPANS: dict[str, list[tuple[int, int]]] = {}


def _inside_function(holder: ast.AST, text: str) -> bool:
    """Whether `holder` (a block holding statements) is a function or lies inside one."""
    if isinstance(holder, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return True
    if not hasattr(holder, "lineno"):
        return False
    spans = _FUNCTION_SPANS.get(text)
    if spans is None:
        spans = _FUNCTION_SPANS[text] = [(n.lineno, n.end_lineno) for n in ast.walk(ast.parse(text))
                                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return any(start < holder.lineno <= end for start, end in spans)


def _allowed(module: str, node: ast.Import | ast.ImportFrom, required: set[str], torchy: dict[str, bool]) -> bool:
    names = _absolute(module, node)
    root = names[0].split(".")[0]
    if root == "torch":
        return True
    if root == "torchpace":
        return any(name in MODULES and _loads_torch(name, torchy) for name in names)
    return root not in sys.stdlib_module_names and root not in required and root != "__future__"


def test_every_import_inside_a_function_loads_torch_an_optional_dependency_or_says_why():
    found = unexplained_imports()
    assert not found, ("imports inside functions that neither load torch nor an optional dependency, with no "
                       "comment saying why they are not at the top:\n" + "\n".join(found))


def test_the_rule_tells_apart_what_it_allows(tmp_path):
    """The classification the rule rests on: torch and a torch-loading module allowed, a torch-free
    module or the standard library not, a comment on the line or above the group enough."""
    required, torchy = _required_roots(), {}
    tree = ast.parse("def f():\n    import torch.nn\n    from torchpace.engine import state\n"
                     "    from torchpace.data import ShardDataset\n    from torchpace.data import write_shards\n"
                     "    from torchpace.knobs import REGISTRY\n    import json\n    import simplejpeg\n")
    verdicts = [_allowed("torchpace.cli", node, required, torchy) for node in tree.body[0].body]
    assert verdicts == [True, True, True, False, False, False, "simplejpeg" not in required]
    lines = ["def f():", "    # lazy: the verb's help loads only the CLI", "    import json", "    import csv",
             "    import re  # why", "", "    import os"]
    body = ast.parse("\n".join(lines)).body[0].body
    assert [_has_reason(lines, node, body) for node in body] == [True, True, True, False]
