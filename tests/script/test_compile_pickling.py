"""`compile.mode` compiles the script's model in place (`torchpace.script.compile`): what the script does with its
model after the measured steps must work as without the knob: whole-module saves and loads, pickling, deep copies,
evaluation, `state_dict` round trips. Real torch.compile (dynamo with its eager backend: the graphs are real, only
inductor's code generation is left out to keep the test short)."""

from __future__ import annotations

import copy
import io
import pickle

import torch
from torch import nn

from torchpace.script.compile import ScriptCompile
from torchpace.script.inprocess import HookReport


class Net(nn.Module):
    """A model class at module level, as a script's is: pickle saves it by reference."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.body(x)


def compiled_in_place(model: nn.Module) -> ScriptCompile:
    """`model` compiled as `compile.mode` does after the script's first backward(), then one compiled step."""
    report = HookReport(config={"compile.mode": "default"})
    compiled = ScriptCompile("default", report, "compile.mode",
                             compiler=lambda fn, **options: torch.compile(fn, backend="eager"))
    compiled.seen[id(model)] = model
    compiled.compile_seen()
    model(torch.randn(4, 8)).sum().backward()
    assert compiled.compiled_calls == 1 and compiled.modules == ["Net"] and "forward" in vars(model)
    return compiled


def test_a_model_compiled_from_outside_saves_loads_and_copies_as_the_scripts_own():
    model = Net()
    compiled_in_place(model)
    x = torch.randn(3, 8)
    expected = model(x)

    buffer = io.BytesIO()
    torch.save(model, buffer)  # the whole module, as word_language_model's main.py saves its best model
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is Net and "forward" not in vars(loaded)  # the user's class, with its own forward
    assert torch.allclose(loaded(x), expected)

    unpickled = pickle.loads(pickle.dumps(model))
    assert type(unpickled) is Net and torch.allclose(unpickled(x), expected)

    ema = copy.deepcopy(model)  # an EMA copy: runs eagerly, same values
    assert "forward" not in vars(ema) and torch.allclose(ema(x), expected)

    fresh = Net()
    fresh.load_state_dict(model.state_dict())
    assert list(fresh.state_dict()) == list(Net().state_dict())  # the same keys, no wrapper's prefix
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(x), expected)
    model.train()
    model(x).sum().backward()  # it still trains after all of that, and is still the compiled one
    assert "forward" in vars(model)


def test_only_torchpaces_compiled_forward_is_left_out_of_a_modules_state():
    compiled_in_place(Net())  # torchpace's __getstate__ is in place for the process
    model = Net()
    own = model.forward
    model.forward = own  # the script's own instance attribute is the script's to pickle
    assert model.__getstate__()["forward"] is own
