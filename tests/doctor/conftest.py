"""Doctor test fixtures: fixture trees shaped like /proc and /sys, and canned facts of a healthy GPU host."""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor_canned import FIXTURES, build_healthy_facts

from torchpace.doctor.facts import DoctorFacts


@pytest.fixture
def healthy() -> DoctorFacts:
    return build_healthy_facts()


@pytest.fixture
def fixture_root():
    """Path of a fixture tree by name (see tests/fixtures/doctor/README.md)."""

    def root(name: str) -> Path:
        path = FIXTURES / name
        assert path.is_dir(), path
        return path

    return root
