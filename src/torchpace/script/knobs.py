"""What script mode knows of an unmodified script before it runs, and which knobs reached it (pure).

A script's model, data and optimizer are unknown until it runs, so the knobs' `applies` see a
`script_target` with none of them; a config is checked against the knobs' `script_reason`
(`check_script_config`); after a trial, `unreached_knobs` names the in-process knobs that never
took effect in the script (no DataLoader was built, the optimizer has no fused kernel...).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from torchpace.config import RunConfig, check_on_host
from torchpace.errors import UsageError
from torchpace.knobs import REGISTRY, ScriptSubject


def script_target(label: str, command: Any = None) -> ScriptSubject:
    """What the knobs' `applies` see of a script: nothing about its model or data is known before it runs; of a
    launcher's command (`command`, a `PythonCommand`), the ranks it starts on this node where its options say."""
    launcher = getattr(command, "launcher", None)
    return ScriptSubject(name=label, ranks_per_node=launcher.ranks_per_node if launcher is not None else None)



# What an unmodified script is taken to run where its config does not say: its own data parallelism (a ddp.*
# knob is given to every DistributedDataParallel the script builds; one that builds none leaves it unreached, and
# the trial is `invalid` naming that)
SCRIPT_OWN_DEFAULTS = {"distributed.strategy": "ddp"}


def check_script_config(config: RunConfig, host, label: str) -> None:
    """UsageError naming the first knob of `config` that cannot run with an unmodified script here: beyond
    the host's limits or in conflict (`check_on_host`, the one bound policy of every mode), needing
    `torchpace.prepare()`, or not applying on this host."""
    check_on_host(config, host, SCRIPT_OWN_DEFAULTS)
    target = script_target(label)
    for name, value in config.non_default().items():
        knob = REGISTRY[name]
        reason = knob.script_reason(value) or knob.applies(host, target) or knob.value_applies(value, host, target)
        if reason:
            raise UsageError(f"knob {name} = {value!r} cannot be used with `{label}`: {reason}")



def unreached_knobs(config: Mapping[str, Any], reached: Iterable[str], not_applied: Mapping[str, str]) -> dict[str, str]:
    """knob -> why, for each knob the config sets that is applied in-process and never took effect in the
    script: a value other than the default, or the default given over the script's own arguments
    (`Reach.sets_arguments`: `--set data.num_workers=0` on a script that builds no DataLoader is not run as if
    it had been applied).

    Args:
        reached, not_applied: what the hook reported (`ScriptInfo.reached`, `ScriptInfo.not_applied`).
    """
    reached = set(reached)
    why: dict[str, str] = {}
    for name, value in RunConfig(dict(config)).values.items():
        reach = REGISTRY[name].script_reach
        if reach is None or reach.missed is None or name in reached:  # only knobs that must meet something
            continue
        if value == REGISTRY[name].default and not reach.sets_arguments:  # the default of autocast/compile: nothing to do
            continue
        why[name] = not_applied.get(name) or f"never took effect in the script: {reach.missed}"
    return why
