"""Measurement: window timing, statistics, memory, and the bench that uses them (docs/design.md#measurement)."""
