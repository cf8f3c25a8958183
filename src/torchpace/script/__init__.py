"""Script mode: `bench`, `tune` and `profile` of an unmodified training script.

A script-mode run is a trial that launches the user's command (`python train.py ARGS`) with a config,
planned by the same planner as `torchpace launch` (`torchpace.trial.script`). Its sitecustomize hook
(`torchpace.script.site`) applies the knobs that can reach the script (`torchpace.script.inprocess`) and installs
`torchpace.script.hook` inside the script's process: steps are counted there (`script.probe`),
measured with `measure.timing.WindowMeter` or traced (`script.profile`), and the result is written to
a file the parent reads. `script.inprocess` (with `script.autocast`) is also what `torchpace launch
--config` runs inside a script. `script.knobs` says which knobs reach a script. The `bench -- CMD` and
`profile -- CMD` flows, which start such trials, are `torchpace.bench.script`.
"""
