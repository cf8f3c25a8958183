"""Fixture: a script that fails before its first step (a bug of its own)."""

import torch

raise RuntimeError(f"planted failure before the first step (torch {torch.__version__})")
