"""The package version, kept apart so `--version` needs no other import."""

__version__ = "0.1.0"
