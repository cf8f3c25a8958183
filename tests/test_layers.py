"""The import contracts of pyproject.toml ([tool.importlinter]: the layers of docs/architecture.md, the
meter's forbidden imports, no cycles between siblings) hold, imports inside functions included."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TIMEOUT_S = 120


def test_import_contracts_hold():
    code = "from importlinter.cli import lint_imports_command; lint_imports_command(['--no-cache'])"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=_TIMEOUT_S)
    assert done.returncode == 0, f"an import breaks a contract of pyproject.toml:\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
    kept = re.search(r"Contracts: (\d+) kept, 0 broken", done.stdout)
    assert kept and int(kept.group(1)) >= 3, done.stdout[-2000:]
