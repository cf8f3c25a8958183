"""`torchpace launch`: plan (pure) -> execute, as DESIGN §11 describes.

`plan_launch` turns options, host facts and the caller's environment into a `LaunchPlan` (argv, the
child's env, and every setting's value, source and reason); `execute` runs it. Importing this
package does not import torch.
"""

from torchpace.launch.plan import LaunchFacts, LaunchOptions, LaunchPlan, RankBinding, Setting, Source, plan_launch

__all__ = ["plan_launch", "LaunchPlan", "LaunchOptions", "LaunchFacts", "Setting", "Source", "RankBinding"]
