"""The directory put first on an unmodified script's PYTHONPATH (by `torchpace launch --config` and by
every script-mode trial): it holds only the `sitecustomize` hook (this file makes the directory ship
with the package)."""
