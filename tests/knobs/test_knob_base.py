"""The knob plug-in contract as prepare() uses it: a plug-in declares its `apply_order` among the knobs
of its point and what else it changes in the step (`configure_step`); prepare() hard-codes neither."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from torchpace.knobs import REGISTRY, Point, Reach
from torchpace.knobs.base import ApplyContext, Knob
from torchpace.runtime import prepare
from torchpace.runtime.prepare import StepOptions

from fixtures.workloads import tiny_mlp, tiny_mlp_with_workers


class _MarkModelKnob(Knob):
    """A MODEL plug-in that records when it applied and asks for micro-batches in the step."""

    stage = "compute"
    point = Point.MODEL
    default = False
    choices = (False, True)
    seen: ClassVar[list[str]] = []

    def apply(self, value, target, ctx):
        _MarkModelKnob.seen.append(self.name)
        return target

    def configure_step(self, value, options, ctx):
        if value:
            options.micro_batch_size = 2


class _EarlyKnob(_MarkModelKnob):
    name = "test.early"
    apply_order = 10


class _LateKnob(_MarkModelKnob):
    name = "test.late"
    apply_order = 95  # after compile.mode's 90


@pytest.fixture
def plugins(monkeypatch):
    _MarkModelKnob.seen.clear()
    for knob in (_LateKnob(), _EarlyKnob()):  # registered late-first: the order must come from apply_order
        monkeypatch.setitem(REGISTRY, knob.name, knob)


def test_every_knob_declares_an_integer_apply_order():
    assert all(isinstance(knob.apply_order, int) for knob in REGISTRY.values())


def test_prepare_applies_in_declared_order_and_takes_step_effects_from_the_knobs(plugins, host):
    with prepare(tiny_mlp(), {"test.late": True}, host=host, device="cpu") as run:
        assert _MarkModelKnob.seen == ["test.early", "test.late"]
        assert run.options.micro_batch_size == 2  # declared by the plug-in, not known to prepare()
        assert torch.isfinite(run.step(next(iter(run.loader))))


@pytest.mark.parametrize("name, value, device, expected", [
    ("data.pin_memory", True, "cuda", {"non_blocking": True}),  # a pinned batch's copy need not wait
    ("data.pin_memory", True, "cpu", {"non_blocking": False}),  # nothing to overlap without a GPU
    ("model.channels_last", True, "cpu", {"channels_last_inputs": True}),
    ("model.channels_last", False, "cpu", {"channels_last_inputs": False}),
])
def test_step_effects_of_the_built_in_knobs_are_declared_on_them(host, name, value, device, expected):
    options = StepOptions()
    REGISTRY[name].configure_step(value, options, ApplyContext(host, tiny_mlp(), torch.device(device), {}))
    assert {key: getattr(options, key) for key in expected} == expected


class _RecordingHook:
    """A ScriptHook that notes which of its actions each knob asked for."""

    def __init__(self):
        self.calls = []

    def enter_global(self, knob, value):
        self.calls.append(("enter_global", knob.name))

    def give_loaders(self, knob, value):
        self.calls.append(("give_loaders", knob.name))

    def give_optimizers(self, knob, value):
        self.calls.append(("give_optimizers", knob.name))

    def autocast_forward(self, knob, value):
        self.calls.append(("autocast_forward", knob.name))

    def layout_forward(self, knob, value):
        self.calls.append(("layout_forward", knob.name))

    def compile_forward(self, knob, value):
        self.calls.append(("compile_forward", knob.name))

    def give_ddp(self, knob, value):
        self.calls.append(("give_ddp", knob.name))


_ACTION_OF_REACH = {Reach.GLOBAL: "enter_global", Reach.LOADER: "give_loaders", Reach.OPTIMIZER: "give_optimizers",
                    Reach.AUTOCAST: "autocast_forward", Reach.LAYOUT: "layout_forward", Reach.COMPILE: "compile_forward",
                    Reach.DDP: "give_ddp"}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_knob_takes_effect_in_a_script_through_the_action_of_its_reach(name):
    knob = REGISTRY[name]
    assert knob.script_reach is None or isinstance(knob.script_reach, Reach)
    hook = _RecordingHook()
    knob.apply_in_script(knob.default, hook)
    in_process = knob.script_reach is not None and knob.script_reach.in_process
    assert hook.calls == ([(_ACTION_OF_REACH[knob.script_reach], name)] if in_process else [])


def test_every_in_process_reach_says_how_and_what_of_the_script_it_reaches():
    for reach in Reach:
        assert reach.reaches and str(reach) == reach.value
        assert bool(reach.how) == reach.in_process
    # knobs that must meet something in the script say what a script they never met lacked
    assert {r for r in Reach if r.missed} == {Reach.LOADER, Reach.OPTIMIZER, Reach.AUTOCAST, Reach.LAYOUT, Reach.COMPILE,
                                              Reach.DDP}


def test_a_workloads_own_loader_arguments_are_the_defaults_its_tune_starts_from(host):
    from torchpace.knobs import workload_defaults
    from torchpace.tune.space import build_space
    from torchpace.tune.tuner import make_conflicts

    own = tiny_mlp_with_workers()
    assert workload_defaults(own) == {"data.num_workers": 2, "data.persistent_workers": True}
    assert workload_defaults(tiny_mlp()) == {}
    space = {k.name: k for k in build_space(host, own, stages=("data",))}
    workers = space["data.num_workers"]
    assert workers.default == 2 and workers.values[0] == 2 and 0 in workers.alternatives  # the baseline runs 2
    assert REGISTRY["data.num_workers"].candidates(host, tiny_mlp())[0] == 0
    # prefetching goes with the workload's own workers, and not with none
    conflicts = make_conflicts(list(space.values()))
    assert conflicts({"data.prefetch_factor": 4}) is None
    assert "needs data.num_workers > 0" in conflicts({"data.prefetch_factor": 4, "data.num_workers": 0})
    # no workers: tried with the workload's persistent workers turned off
    assert conflicts({"data.num_workers": 0}) is not None
    assert conflicts({"data.num_workers": 0, **workers.companions[0]}) is None
