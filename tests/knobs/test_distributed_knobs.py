"""The distributed knobs: where they apply, what goes together, what the tuner tries."""

from __future__ import annotations

import pytest
import torch

from torchpace.config import RunConfig
from torchpace.errors import UsageError
from torchpace.host import GpuInfo, HostFacts
from torchpace.knobs import get_knob
from torchpace.runtime import prepare
from torchpace.tune.space import build_space
from torchpace.tune.tuner import make_conflicts

from _support import fixture_workload

CPU4 = HostFacts(logical_cpus=4, usable_cores=4)
CPU1 = HostFacts(logical_cpus=1, usable_cores=1)
GPU2 = HostFacts(logical_cpus=32, usable_cores=32, gpus=(GpuInfo(0, "H100", 80 << 30), GpuInfo(1, "H100", 80 << 30)))


@pytest.fixture(scope="module")
def mlp():
    from torchpace.workload import load_workload

    return load_workload(fixture_workload("tiny_mlp"))


def test_processes_are_capped_by_gpus_else_usable_cores(mlp):
    nproc = get_knob("nproc_per_node")
    assert nproc.candidates(CPU4, mlp) == [1, 2, 4] and nproc.candidates(GPU2, mlp) == [1, 2]
    assert "8 is more than this host allows: at most 4" in nproc.host_reason(8, CPU4)
    assert "4 usable CPU core(s)" in nproc.host_reason(8, CPU4) and "2 GPU(s)" in nproc.host_reason(4, GPU2)
    assert nproc.host_reason(4, CPU4) is None
    assert get_knob("distributed.strategy").candidates(CPU1, mlp) == ["none"]  # one core: nothing to spread over


def test_nccl_without_gpus_and_knobs_for_the_other_wrapper_do_not_apply(mlp):
    assert "this host has none" in get_knob("distributed.backend").value_applies("nccl", CPU4, mlp)
    values = RunConfig({"distributed.strategy": "fsdp", "ddp.bucket_cap_mb": 50}).full_values()
    assert "needs distributed.strategy = ddp" in get_knob("ddp.bucket_cap_mb").conflicts(values)
    values = RunConfig({"distributed.strategy": "ddp", "fsdp.reshard_after_forward": False}).full_values()
    assert "needs distributed.strategy = fsdp" in get_knob("fsdp.reshard_after_forward").conflicts(values)
    values = RunConfig({"nproc_per_node": 2}).full_values()
    assert "needs distributed.strategy = ddp or fsdp" in get_knob("nproc_per_node").conflicts(values)


def test_prepare_refuses_them_with_the_reason(mlp):
    with pytest.raises(UsageError, match="nccl runs on CUDA GPUs"):
        prepare(mlp, {"distributed.strategy": "ddp", "distributed.backend": "nccl"}, host=CPU4)
    with pytest.raises(UsageError, match="needs distributed.strategy = ddp"):
        prepare(mlp, {"ddp.static_graph": True}, host=CPU4)


def test_inference_workloads_have_no_distributed_knobs():
    from torchpace.workload import load_workload

    inference = load_workload(fixture_workload("tiny_inference"))
    assert "only for training" in get_knob("distributed.strategy").applies(CPU4, inference)


def test_the_tuner_tries_two_processes_with_ddp_and_never_a_strategy_in_one_process(mlp):
    space = {k.name: k for k in build_space(CPU4, mlp, stages=("distributed",))}
    assert list(space) == ["nproc_per_node", "distributed.strategy", "ddp.bucket_cap_mb", "ddp.gradient_as_bucket_view",
                           "ddp.static_graph", "ddp.find_unused_parameters", "fsdp.reshard_after_forward"]
    assert space["nproc_per_node"].companions == {2: {"distributed.strategy": "ddp"}, 4: {"distributed.strategy": "ddp"}}
    conflicts = make_conflicts(list(space.values()))
    assert conflicts({"distributed.strategy": "ddp"}) == "one process: nothing to distribute"
    assert conflicts({"nproc_per_node": 2, "distributed.strategy": "ddp", "ddp.static_graph": True}) is None


def test_ddp_in_one_process_wraps_the_model_in_a_loopback_group_the_next_prepare_reuses(mlp):
    groups = []
    for _ in range(2):
        with prepare(mlp, {"distributed.strategy": "ddp", "ddp.bucket_cap_mb": 5}, host=CPU4) as run:
            assert type(run.model).__name__ == "DistributedDataParallel" and run.world_size == 1
            assert run.model.bucket_bytes_cap == 5 * 1024 * 1024
            assert torch.isfinite(run.step(next(iter(run.loader))))
            groups.append(torch.distributed.group.WORLD)
    assert groups[0] is groups[1] and torch.distributed.is_initialized()


def test_the_wrappers_options_come_from_the_knobs_with_their_defaults():
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    from torchpace.knobs.distributed import data_parallel

    plain = data_parallel({})
    assert (plain.strategy, plain.backend, plain.enabled) == ("none", "auto", False)
    assert plain.ddp == {"bucket_cap_mb": 25, "gradient_as_bucket_view": False, "static_graph": False,
                         "find_unused_parameters": False}
    assert plain.fsdp == {"reshard_after_forward": True}
    tuned = data_parallel(RunConfig({"distributed.strategy": "ddp", "ddp.static_graph": True}).full_values())
    assert tuned.enabled and tuned.ddp["static_graph"] is True and tuned.ddp["bucket_cap_mb"] == 25
    # every ddp.* knob names an argument DistributedDataParallel really takes
    assert set(plain.ddp) <= set(inspect.signature(DistributedDataParallel.__init__).parameters)
    assert tuned.wrapper_options is tuned.ddp and plain.wrapper_options == {}
