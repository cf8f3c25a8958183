"""What a profiled run already does, read from its trace (`torchpace.profile.effect`)."""

from __future__ import annotations

from _profile_traces import document, ev, label, step

from torchpace.profile.effect import settings_in_effect
from torchpace.profile.trace import parse_trace


def _closure_step(optimizer_ops: list[tuple[str, float]], run: dict | None = None) -> dict:
    """One 10 ms step whose optimizer label holds a closure's forward and backward (Lightning's shape)."""
    events = [step(2, 0, 10_000), label("optimizer", 1_000, 8_000), label("forward", 1_500, 2_000),
              label("backward", 3_500, 3_000), ev("aten::_foreach_norm", 6_000, 100), ev("aten::_foreach_mul_", 6_200, 100)]
    events += [ev(name, ts, 50) for name, ts in optimizer_ops]
    return document(events, metadata={"device": "cpu", "run": run or {}})


def test_a_fused_optimizer_kernel_in_the_operators_is_in_effect():
    effect = settings_in_effect(parse_trace(_closure_step([("aten::_fused_adamw_", 8_000)])))
    assert effect == {"optimizer.impl": "the optimizer already runs fused kernels (aten::_fused_adamw_ in the operators)"}


def test_foreach_update_ops_count_only_inside_the_optimizer_itself():
    # clip_grad_norm_'s _foreach_norm / _foreach_mul_ inside the closure's backward are not the optimizer's update
    assert settings_in_effect(parse_trace(_closure_step([]))) == {}
    in_backward = settings_in_effect(parse_trace(_closure_step([("aten::_foreach_addcdiv_", 5_000)])))
    assert in_backward == {}
    in_optimizer = settings_in_effect(parse_trace(_closure_step([("aten::_foreach_addcdiv_", 7_000)])))
    assert "aten::_foreach_addcdiv_ in its step" in in_optimizer["optimizer.impl"]


def test_autocast_workers_pinning_and_compiled_regions_are_in_effect():
    run = {"autocast_dtype": "bfloat16", "param_dtype": "float32", "num_workers": 3, "pin_memory": True}
    doc = _closure_step([], run)
    doc["traceEvents"].append(ev("Torch-Compiled Region: 0/0", 1_600, 1_000, cat="user_annotation"))
    effect = settings_in_effect(parse_trace(doc))
    assert effect["precision.amp"] == "the forward already runs under bfloat16 autocast"
    assert effect["data.num_workers"] == "the DataLoader already loads in 3 worker process(es)"
    assert effect["data.pin_memory"] == "the DataLoader already pins its batches"
    assert "already runs compiled" in effect["compile.mode"]
    bf16_weights = settings_in_effect(parse_trace(_closure_step([], {"param_dtype": "bfloat16", "num_workers": 0})))
    assert bf16_weights == {"precision.amp": "the model's parameters are already bfloat16"}
