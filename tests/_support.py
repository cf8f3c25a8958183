"""Helpers shared by test modules (a uniquely named module: every test folder has its own conftest)."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_workload(name: str) -> str:
    """Workload spec of a planted workload in tests/fixtures/workloads.py."""
    return f"{FIXTURES / 'workloads.py'}:{name}"


def sigint_as_at_a_terminal() -> None:
    """`preexec_fn` of a child that a test interrupts with SIGINT: SIGINT at its default. A test suite
    started in the background (`make test &`) inherits SIGINT ignored, and a child keeps an ignored
    signal ignored (as nohup relies on): then there would be no Ctrl-C to deliver."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
