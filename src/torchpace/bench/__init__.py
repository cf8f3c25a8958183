"""The `torchpace bench` flows: a workload's (`run.py`: where its bench runs, with its progress bar) and
an unmodified script's (`script.py`, which also holds `profile -- CMD`: both run the script as a
script-mode trial). The meter is `torchpace.measure`; a bench's measurement of a prepared workload is
`torchpace.trial.bench`."""
