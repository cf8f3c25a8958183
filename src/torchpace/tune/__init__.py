"""Tuning: the study, strategies and the convergence guard (docs/design.md#the-tuner)."""
