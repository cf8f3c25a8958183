"""The `torchpace bench` flow (`run.py`): where a workload's bench runs, with its progress bar. The
meter is `torchpace.measure`; a bench's measurement of a prepared workload is `torchpace.trial.bench`."""
