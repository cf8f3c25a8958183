"""Tuning: the study, strategies and the convergence guard (DESIGN §7)."""
