"""Script mode: `bench`, `tune` and `profile` of an unmodified training script.

A script-mode run is a launch of the user's command (`python train.py ARGS`) with a config, planned by
the same planner as `torchpace launch`, whose sitecustomize hook applies the knobs that can reach the
script (`torchpace.launch.inprocess`) and, for a measurement, installs `torchpace.script.hook` inside
the script's process: steps are counted there, measured with `measure.timing.WindowMeter`, and the
result is written to a file the parent reads (`torchpace.script.run`).
"""
