"""torchpace launch's sitecustomize: apply a config's global and DataLoader knobs to an unmodified script.

`torchpace launch --config F` and every script-mode trial put this directory first on the script's
PYTHONPATH and the knob values in TORCHPACE_LAUNCH_CONFIG (JSON); a script-mode trial also puts what to
measure in TORCHPACE_SCRIPT_MEASURE. Python imports this module at start-up, before the script. It is
import-safe and cheap: without that variable it does nothing, and with it it only adds a finder that
waits for the script's own `import torch`; torch and torchpace are imported by the script's choice,
never here. Once torch has finished importing, `torchpace.script.inprocess` applies the knobs into one
`HookReport`, and `torchpace.script.hook` starts the measurement with that same report. Any
`sitecustomize` this one shadows (a distribution's or a virtualenv's) still runs, after it.
"""

import os
import sys
from importlib.machinery import PathFinder

_CONFIG_ENV = "TORCHPACE_LAUNCH_CONFIG"  # torchpace.launch.plan.CONFIG_ENV
_MEASURE_ENV = "TORCHPACE_SCRIPT_MEASURE"  # torchpace.script.spec.MEASURE_ENV: a script-mode measurement
_RUN_ON_ENV = "TORCHPACE_RUN_ON"  # torchpace.script.runon.RUN_ON_ENV: a tune's run past the measured steps
_HERE = os.path.dirname(os.path.abspath(__file__))


def _apply(raw, measure):
    """Apply the knobs in `raw` (JSON), then start the script-mode measurement `measure` (JSON) if any.

    A failure to apply the config is reported and never breaks the script's import; a measurement that
    cannot start is reported too (the parent then finds no result and says the hook did not run).
    """
    import json  # lazy: every process under the hook runs this module at start-up; only a config needs it

    try:
        # lazy: torchpace loads only once the script imported torch (the config is applied then)
        from torchpace.script.inprocess import HookReport, apply_launch_config
    except ImportError as err:
        sys.stderr.write(f"torchpace launch: cannot apply the config in this interpreter ({err})\n")
        return
    report = HookReport()  # this process's one record of what the hook did, passed to what reads it
    try:
        apply_launch_config(json.loads(raw or "{}"), report)
    except Exception as err:  # the script's `import torch` must still succeed; say what was skipped
        sys.stderr.write(f"torchpace launch: the config was not applied: {err!r}\n")
    run_on = os.environ.get(_RUN_ON_ENV)
    if run_on and not measure:
        try:
            from torchpace.script.runon import install  # lazy: only a tune's run-on check needs it
            install(run_on)
        except Exception as err:
            sys.stderr.write(f"torchpace: the run-on check could not start in this script: {err!r}\n")
    if measure:
        try:
            from torchpace.script.hook import install_from_json  # lazy: only a script-mode measurement needs it

            install_from_json(measure, report)
        except Exception as err:
            sys.stderr.write(f"torchpace: the measurement could not start in this script: {err!r}\n")


class _ThenApply:
    """Loads a module with its own loader, then applies the config."""

    def __init__(self, loader, raw, measure):
        self.loader, self.raw, self.measure = loader, raw, measure

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader  # the module sees its real loader
        self.loader.exec_module(module)
        _apply(self.raw, self.measure)


class _TorchImportWatcher:
    """A one-shot meta path finder: when `torch` is imported, apply the config after it loads."""

    def __init__(self, raw, measure):
        self.raw, self.measure = raw, measure

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util  # lazy: only when the script imports torch

        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenApply(spec.loader, self.raw, self.measure)
        return spec


def _run_shadowed_sitecustomize():
    """Run the next `sitecustomize` on sys.path, which this module hides by coming first.

    Built by hand rather than with importlib.util, whose imports would double this hook's start-up cost.
    """
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = spec.loader.create_module(spec) or type(sys)(spec.name)
    module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
    spec.loader.exec_module(module)


def _for_descendants(measure):
    """The measurement spec the processes this one starts inherit (`ScriptMeasure.for_descendants`, written here
    with the standard library only): they may be the job's ranks (a launcher's, or ones the script spawns), and
    each measures only if it trains; the gate's pipes are this process's alone."""
    import json  # lazy: only a script-mode measurement needs it

    spec = json.loads(measure)
    spec["in_turns"] = bool(spec.get("in_turns") or spec.get("gate"))
    if not spec.get("descendant"):
        spec["root_pid"] = os.getpid()
    spec.update(descendant=True, gate=None)
    return json.dumps(spec, sort_keys=True)


def _install():
    raw = os.environ.get(_CONFIG_ENV)
    # The processes the script starts (a launcher's ranks, ranks it spawns, DataLoader workers, a subprocess)
    # inherit the measurement as descendants: one that trains is a rank of the job (or, alone, the measured
    # process); the others never measure nor report. The config's knobs reach them all, as under `launch`.
    measure = os.environ.get(_MEASURE_ENV)
    if measure:
        os.environ[_MEASURE_ENV] = _for_descendants(measure)
    if not raw and not measure and not os.environ.get(_RUN_ON_ENV):
        return
    if "torch" in sys.modules:
        _apply(raw, measure)
    else:
        sys.meta_path.insert(0, _TorchImportWatcher(raw, measure))


_install()
_run_shadowed_sitecustomize()
