"""Measurement: window timing, statistics, memory, and the bench that uses them (DESIGN §5)."""
