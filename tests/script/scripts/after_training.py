"""What a training script commonly does with its model once it has trained, each step checked and reported.

`life_after(model, inputs, folder)` runs, in order: a whole-module `torch.save` to a file and `torch.load` (the
script's own class comes back, with its class's forward); a `state_dict` save to a file loaded into a fresh model
of the same class (the same keys, `strict=True`); `copy.deepcopy` (an EMA copy); `model.eval()` and a `no_grad`
evaluation; `torch.jit.trace` and `torch.export.export` of the model in eval mode; `pickle.dumps`/`loads`; then
`model.train()` again and one more backward. Each is "ok" or the error it raised (type and first line), so a
knob that breaks one is named by the step it broke. Outputs of the copies are compared with the model's own
evaluation (within bf16's rounding, where autocast computes them).
"""

import copy
import pickle
from pathlib import Path

import torch


def _close(a, b):
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def life_after(model, inputs, folder, trainer=None):
    """The checks' verdicts by name; `trainer` (default `model`) is what trains again: a DDP wrapper of `model`."""
    folder = Path(folder)
    checks = {}
    model.eval()
    with torch.no_grad():
        expected = model(inputs)

    def check(name, step):
        try:
            verdict = step()
            checks[name] = "ok" if verdict in (None, True) else f"wrong: {verdict}"
        except Exception as err:  # noqa: BLE001 - the report names whatever the step raised
            checks[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"

    def whole_module():
        path = folder / "model.pt"
        torch.save(model, path)
        loaded = torch.load(path, weights_only=False)
        if type(loaded) is not type(model):
            return f"loaded a {type(loaded).__qualname__}, saved a {type(model).__qualname__}"
        if "forward" in vars(loaded):
            return "the loaded model has an instance forward the class does not define"
        loaded.eval()
        with torch.no_grad():
            return _close(loaded(inputs), expected) or "the loaded model computes other outputs"

    def state_dict():
        path = folder / "state.pt"
        torch.save(model.state_dict(), path)
        fresh = type(model)()
        fresh.load_state_dict(torch.load(path), strict=True)
        fresh.eval()
        with torch.no_grad():
            return _close(fresh(inputs), expected) or "a fresh model with the saved state computes other outputs"

    def deep_copy():
        ema = copy.deepcopy(model)
        with torch.no_grad():
            return _close(ema(inputs), expected) or "the copy computes other outputs"

    def evaluation():
        with torch.no_grad():
            return _close(model(inputs), expected) or "a second evaluation computes other outputs"

    def jit_trace():
        traced = torch.jit.trace(model, inputs, check_trace=False)
        with torch.no_grad():
            return _close(traced(inputs), expected) or "the traced model computes other outputs"

    def export():
        exported = torch.export.export(model, (inputs,))
        with torch.no_grad():
            return _close(exported.module()(inputs), expected) or "the exported program computes other outputs"

    def pickled():
        again = pickle.loads(pickle.dumps(model))
        return type(again) is type(model) or f"unpickled a {type(again).__qualname__}"

    def train_again():
        model.train()
        loss = (trainer or model)(inputs).float().pow(2).mean()
        loss.backward()
        return bool(torch.isfinite(loss)) or "the loss is not finite"

    for name, step in (("torch.save(model)", whole_module), ("state_dict", state_dict), ("deepcopy", deep_copy),
                       ("eval", evaluation), ("jit.trace", jit_trace), ("export", export), ("pickle", pickled),
                       ("train again", train_again)):
        check(name, step)
    return checks
