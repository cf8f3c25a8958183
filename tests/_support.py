"""Helpers shared by test modules (a uniquely named module: every test folder has its own conftest)."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_workload(name: str) -> str:
    """Workload spec of a planted workload in tests/fixtures/workloads.py."""
    return f"{FIXTURES / 'workloads.py'}:{name}"
