"""Inference knobs: where they apply, their candidates and conflicts, and the tuner's search space."""

import torch
from torch import nn

from torchpace.knobs import REGISTRY
from torchpace.tune.space import build_space
from torchpace.workload import Workload

from inference_planted import trains, wide_mlp

INFERENCE_KNOBS = ("inference.mode", "inference.quantize", "inference.export", "inference.batch_size")


def test_inference_knobs_do_not_apply_to_training_workloads(host):
    for name in INFERENCE_KNOBS:
        assert REGISTRY[name].applies(host, wide_mlp()) is None
        assert "only for inference workloads" in REGISTRY[name].applies(host, trains())


def test_quantize_needs_linear_or_recurrent_layers(host):
    convs = Workload(model=nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), dataset=torch.utils.data.TensorDataset(torch.ones(4, 3, 8, 8)))
    assert "no Linear, LSTM or GRU" in REGISTRY["inference.quantize"].applies(host, convs)


def test_export_needs_the_models_inputs_and_torchscript_cannot_be_compiled(host):
    custom = wide_mlp()
    custom.forward = lambda model, batch: model(batch[0])
    assert "custom forward" in REGISTRY["inference.export"].applies(host, custom)
    export = REGISTRY["inference.export"]
    assert "torch.compile" in export.conflicts({"inference.export": "torchscript", "compile.mode": "default"})
    assert export.conflicts({"inference.export": "torch_export", "compile.mode": "default"}) is None


def test_int8_layers_cannot_run_under_autocast():
    quantize = REGISTRY["inference.quantize"]
    assert "float32 inputs" in quantize.conflicts({"inference.quantize": "dynamic_int8", "precision.amp": "bf16"})
    assert quantize.conflicts({"inference.quantize": "dynamic_int8", "precision.amp": "off"}) is None


def test_batch_size_candidates_bracket_the_workloads_batch(host):
    assert REGISTRY["inference.batch_size"].candidates(host, wide_mlp()) == ["workload", 16, 64, 128]


def test_space_has_the_inference_stage_only_for_inference_workloads(host):
    inference = {k.name: k for k in build_space(host, wide_mlp())}
    assert {"inference.mode", "inference.quantize", "inference.export", "inference.batch_size"} <= set(inference)
    assert [k.stage for k in build_space(host, wide_mlp())][-1] == "inference"  # tried after the compute stage
    assert not {k.name for k in build_space(host, trains())} & set(INFERENCE_KNOBS)


def test_latency_objective_leaves_out_knobs_that_cannot_change_batch1_latency(host):
    names = {k.name for k in build_space(host, wide_mlp(), objective="latency")}
    assert "inference.batch_size" not in names and "data.num_workers" not in names
    assert {"inference.mode", "inference.quantize", "threads.intra_op"} <= names
