"""`torchpace monitor`: run a command and watch GPU, CPU, memory and I/O while it runs.

Layout, facts -> decisions -> effects:

- `samples`: the frozen `Sample` (units in field names), CSV columns, summary statistics;
- `samplers`: `HostSampler` (psutil, /proc) and `GpuSampler` (NVML) read raw counters;
  `build_sample` turns two readings into rates;
- `symptoms`: pure alert rules with hysteresis, each alert a `Finding` with a remedy;
- `sinks`: CSV and TensorBoard logs;
- `live`: the live Rich view, plain lines, the exit summary;
- `run`: starts CMD, runs the sampler thread, forwards signals, cleans up.

Importing this package imports neither torch nor psutil; the submodules import what they need.
"""

# the shortest interval between samples: each sample reads every process of CMD's tree and the host's
# counters (milliseconds of CPU), and its rates are averages over the interval
MIN_INTERVAL_S = 0.1
# the longest: a sample an hour is already too rare to see a run's symptoms (and a larger one overflows
# the clock's arithmetic)
MAX_INTERVAL_S = 3600.0
