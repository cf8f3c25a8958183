"""`torchpace profile`: why a workload is slow (docs/design.md#profile).

capture.py runs the workload's real steps under `torch.profiler` (effects); trace.py parses the
exported Chrome trace (pure); analyzers.py are the plug-ins that turn it into Findings; verdict.py
names the bottleneck, its remedies and the knob stages to tune first; render.py shows it.

Importing this package does not import torch; `stages_to_try_first` is the tuner's entry point.
"""

from torchpace.profile.verdict import Verdict, VerdictKind, build_verdict, stages_to_try_first

__all__ = ["Verdict", "VerdictKind", "build_verdict", "stages_to_try_first"]
