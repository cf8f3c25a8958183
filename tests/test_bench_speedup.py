"""`benchmarks/bench_speedup.py` (`make bench-speedup`): its pure parts, checked without running a tune.

The expert's config follows the host's facts (faked: with and without native bf16), MFU is FLOPs per
sample times samples/s over a known GPU's peak, and the FLOPs are torch's count of the real models.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from _support import faked_host

_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_speedup.py"


def _load():
    sys.path.insert(0, str(_SCRIPT.parent))  # as `python benchmarks/bench_speedup.py` has it: its `_args`
    spec = importlib.util.spec_from_file_location("bench_speedup", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


speedup = _load()


def test_the_experts_cpu_config_is_bf16_where_the_cpu_computes_it_and_channels_last_for_the_conv_net():
    host = faked_host("native bf16")
    resnet = speedup.expert_config("resnet", host)
    assert resnet["precision.amp"] == "bf16" and resnet["model.channels_last"] is True
    assert not {"precision.matmul", "backends.cudnn_benchmark", "optimizer.impl"} & set(resnet)  # CUDA-only levers
    gpt = speedup.expert_config("gpt", host)
    assert gpt["precision.amp"] == "bf16" and "model.channels_last" not in gpt
    assert ("compile.mode" in gpt) == host.has_compiler  # compile needs a C compiler on a CPU


def test_without_native_bf16_the_expert_does_not_ask_for_it():
    host = faked_host("no-bf16, one NUMA node")
    assert "precision.amp" not in speedup.expert_config("resnet", host)
    assert speedup.expert_config("resnet", host)["model.channels_last"] is True


def test_mfu_is_the_steps_flops_per_second_over_the_gpus_dense_bf16_peak():
    assert speedup.gpu_peak_flops("NVIDIA H200") == pytest.approx(989.4e12)
    assert speedup.gpu_peak_flops("NVIDIA H100 PCIe") == pytest.approx(756e12)
    assert speedup.gpu_peak_flops("NVIDIA A100-SXM4-80GB") == pytest.approx(312e12)
    assert speedup.gpu_peak_flops("a GPU nobody listed") is None
    assert speedup.mfu(1000.0, 24.3e9, 312e12) == pytest.approx(1000 * 24.3e9 / 312e12)
    assert speedup.mfu(None, 24.3e9, 312e12) is None and speedup.mfu(1000.0, 24.3e9, None) is None


def test_the_flop_count_of_a_resnet50_sample_is_three_times_its_forward():
    # ResNet-50 at 224 px is 4.1 GMACs forward (8.2 GFLOP): forward and backward about three times that
    flops = speedup.flops_per_sample("resnet", "full")
    assert 23e9 < flops < 26e9


def test_the_table_shows_each_ratio_with_its_ci_and_a_failure_with_its_reason():
    row = speedup.Row("resnet", "small", {"precision.amp": "bf16"}, {"precision.amp": "bf16"}, 900.0, 20,
                      (1.82, 1.75, 1.9), (1.01, 0.98, 1.04), 150.0, 5.4e9, None)
    failed = speedup.Row("gpt", "small", {}, {}, 0.0, 0, (None,) * 3, (None,) * 3, None, None, None, failure="exit 1: x")
    table = speedup.render([row, failed], "a CPU")
    assert "1.82x [1.75, 1.90]" in table and "1.01x [0.98, 1.04]" in table and "precision.amp=bf16" in table
    assert "FAIL: exit 1: x" in table
