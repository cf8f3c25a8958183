"""Every registered knob must pass these: a reason when it does not apply, a TOML round trip, and in a
prepared run it really changes what it claims (CLAIMS below: a new knob must add its check)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchpace.config import RunConfig, load_config, save_config
from torchpace.errors import UsageError
from torchpace.host import ALLOCATOR_LIBRARIES, NumaNode
from torchpace.knobs import REGISTRY, Point, Reach
from torchpace.knobs.child import ChildDraft, ChildRequest
from torchpace.launch.plan import LaunchFacts
from torchpace.runtime import prepare
from torchpace.engine.checkpointing import CheckpointedBlock
from torchpace.trial.runner import plan_trial

from _support import FAKED_HOSTS, faked_host, hosts_where_verdicts_differ
from fixtures.workloads import tiny_cnn, tiny_inference, tiny_mlp


def _autocast_seen(workload):
    seen = {}

    def hook(module, args):
        seen["enabled"] = torch.is_autocast_enabled("cpu")
        seen["dtype"] = torch.get_autocast_dtype("cpu")

    workload.model.register_forward_pre_hook(hook)
    return seen


def check_threads(host):
    before = torch.get_num_threads()
    with prepare(tiny_mlp(), {"threads.intra_op": 1}, host=host):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def _trial_plan(config, host):
    """The trial child's plan (the one child planner's, as `launch` plans it) for `config`."""
    facts = LaunchFacts(python=sys.executable, nofile_soft=None, nofile_hard=None)
    return plan_trial(config, host, {}, Path("spec.json"), Path("result.json"), facts)


def check_allocator(host):
    lib = host.allocator_library("jemalloc")
    if lib is None:
        with pytest.raises(UsageError, match="jemalloc was asked for"):
            _trial_plan({"system.allocator": "jemalloc"}, host)
        pytest.skip("jemalloc is not installed here: the preload itself cannot be shown")
    env = _trial_plan({"system.allocator": "jemalloc"}, host).env
    assert env["LD_PRELOAD"].startswith(lib) and "MALLOC_CONF" in env
    maps = subprocess.run([sys.executable, "-c", "print(open('/proc/self/maps').read())"], env=env,
                          capture_output=True, text=True, check=True).stdout
    assert any(name in maps for name in ALLOCATOR_LIBRARIES["jemalloc"])


def check_numa(host):
    two_nodes = dataclasses.replace(host, numa_nodes=(NumaNode(0, (0,)), NumaNode(1, (1,))), numactl="/usr/bin/numactl",
                                    gpus=())
    bound = _trial_plan({"system.numa": "bind"}, two_nodes)  # the rank's CPUs and memory, as launch binds them
    assert bound.argv[:3] == ("/usr/bin/numactl", "--physcpubind=0", "--membind=0") and bound.env["GOMP_CPU_AFFINITY"] == "0"
    assert _trial_plan({"system.numa": "off"}, two_nodes).argv[0] == sys.executable


def check_num_workers(host):
    with prepare(tiny_mlp(), {"data.num_workers": 2}, host=host) as run:
        assert run.loader.num_workers == 2


def check_pin_memory(host):
    with prepare(tiny_mlp(), {"data.pin_memory": True}, host=host) as run:
        assert run.loader.pin_memory and run.options.non_blocking
        batch = run.to_device(next(iter(run.loader)))
        assert batch[0].device.type == "cuda"


def check_prefetch_factor(host):
    with prepare(tiny_mlp(), {"data.num_workers": 1, "data.prefetch_factor": 4}, host=host) as run:
        assert run.loader.prefetch_factor == 4
    with pytest.raises(UsageError, match="needs data.num_workers > 0"):
        prepare(tiny_mlp(), {"data.prefetch_factor": 4}, host=host)


def check_persistent_workers(host):
    with prepare(tiny_mlp(), {"data.num_workers": 1, "data.persistent_workers": True}, host=host) as run:
        assert run.loader.persistent_workers


def check_amp(host):
    workload = tiny_mlp()
    seen = _autocast_seen(workload)
    with prepare(workload, {"precision.amp": "bf16"}, host=host) as run:
        loss = run.step(next(iter(run.loader)))
    assert seen == {"enabled": True, "dtype": torch.bfloat16}
    assert torch.isfinite(loss)


def check_matmul_precision(host):
    before = torch.get_float32_matmul_precision()
    with prepare(tiny_mlp(), {"precision.matmul": "high"}, host=host):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before


def check_cudnn_benchmark(host):
    with prepare(tiny_cnn(), {"backends.cudnn_benchmark": True}, host=host):
        assert torch.backends.cudnn.benchmark
    assert not torch.backends.cudnn.benchmark


def check_channels_last(host):
    with prepare(tiny_cnn(), {"model.channels_last": True}, host=host) as run:
        assert run.model.stem.weight.is_contiguous(memory_format=torch.channels_last)
        batch = run.to_device(next(iter(run.loader)))
        assert batch[0].is_contiguous(memory_format=torch.channels_last)


def check_compile(host):
    with prepare(tiny_mlp(), {"compile.mode": "default"}, host=host) as run:
        assert isinstance(run.model, torch._dynamo.eval_frame.OptimizedModule)
        assert torch.isfinite(run.step(next(iter(run.loader))))


def check_optimizer_impl(host):
    for impl in ("foreach", "fused"):
        with prepare(tiny_mlp(), {"optimizer.impl": impl}, host=host) as run:
            assert run.optimizer.param_groups[0][impl] is True
            assert run.optimizer.defaults[impl] is True
            assert isinstance(run.optimizer, torch.optim.AdamW)


def _grads_after_one_step(config, host):
    with prepare(tiny_cnn(), {**config, "optimizer.impl": "default"}, host=host) as run:
        run.workload.shuffle = False
        batch = run.to_device(next(iter(run.loader)))
        run.optimizer.zero_grad()
        run._forward_backward(batch)
        return [p.grad.clone() for p in run.model.parameters()], run


def check_activation_checkpointing(host):
    plain, _ = _grads_after_one_step({}, host)
    checkpointed, run = _grads_after_one_step({"model.activation_checkpointing": True}, host)
    assert all(isinstance(block, CheckpointedBlock) for block in run.model.blocks)
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b)


def check_micro_batch(host):
    full, _ = _grads_after_one_step({}, host)
    micro, run = _grads_after_one_step({"data.micro_batch_size": 4}, host)
    assert run.grad_accumulation * 4 == run.workload.batch_size
    for a, b in zip(full, micro):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


_JPEG_DIR: list = []


def tiny_jpeg_cnn():
    """tiny_cnn's model on a torchpace.data.ImageFolderDataset of 16 real JPEGs (written once per session)."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    import numpy as np
    from PIL import Image

    from torchpace.data import CropFlipNormalize, ImageFolderDataset

    if not _JPEG_DIR:
        root = Path(tempfile.mkdtemp(prefix="torchpace-conformance-"))
        atexit.register(shutil.rmtree, root, True)
        rng = np.random.default_rng(0)
        for label in range(4):
            (root / "images" / f"c{label}").mkdir(parents=True)
            for index in range(4):
                pixels = (rng.random((16, 16, 3)) * 64 + label * 60).astype(np.uint8)
                Image.fromarray(pixels).save(root / "images" / f"c{label}" / f"{index}.jpg")
        _JPEG_DIR.append(root)
    workload = tiny_cnn()
    workload.dataset = ImageFolderDataset(_JPEG_DIR[0] / "images", transform=CropFlipNormalize(12, (0.5,) * 3, (0.25,) * 3),
                                          shard_cache_dir=_JPEG_DIR[0] / "cache")
    workload.batch_size = 4
    return workload


def check_decoder(host):
    from unittest import mock

    import simplejpeg

    with mock.patch("simplejpeg.decode_jpeg", wraps=simplejpeg.decode_jpeg) as decode:
        with prepare(tiny_jpeg_cnn(), {"data.decoder": "simplejpeg"}, host=host) as run:
            assert run.loader.dataset.decoder.name == "simplejpeg"
            assert torch.isfinite(run.step(next(iter(run.loader))))
    assert decode.call_count >= 4  # one batch of 4 images went through simplejpeg


def check_format(host):
    from torchpace.data import ShardDataset

    workload = tiny_jpeg_cnn()
    with prepare(workload, {"data.format": "shards"}, host=host) as run:
        assert isinstance(run.loader.dataset, ShardDataset)
        assert all(path.suffix == ".tar" and path.is_file() for path in run.loader.dataset.shards)
        labels = sorted(label for _, batch in run.loader for label in batch.tolist())
        assert torch.isfinite(run.step(next(iter(run.loader))))
    assert labels == sorted(label for _, label in workload.dataset.samples)


_CLAIM_WORKLOADS = {"data.decoder": tiny_jpeg_cnn, "data.format": tiny_jpeg_cnn}


def check_inference_mode(host):
    with prepare(tiny_inference(), {"inference.mode": "inference_mode"}, host=host) as run:
        assert run.options.inference_mode and torch.is_inference(run.step(next(iter(run.loader))))
    with prepare(tiny_inference(), host=host) as run:
        assert not torch.is_inference(run.step(next(iter(run.loader))))  # plain no_grad by default


def check_quantize(host):
    with prepare(tiny_inference(), {"inference.quantize": "dynamic_int8"}, host=host) as run:
        kinds = [type(m) for m in run.model.modules()]
        assert kinds.count(torch.ao.nn.quantized.dynamic.Linear) == 3 and torch.nn.Linear not in kinds  # tiny_mlp has 3
        assert torch.isfinite(run.step(next(iter(run.loader)))).all()


def check_export(host):
    batch = next(iter(tiny_inference().dataset.tensors[0].split(32)))
    with torch.no_grad():
        eager = tiny_inference().model(batch)
    for value, kind in (("torch_export", torch.fx.GraphModule), ("torchscript", torch.jit.ScriptModule)):
        with prepare(tiny_inference(), {"inference.export": value}, host=host) as run:
            assert isinstance(run.model, kind)
            torch.testing.assert_close(run.step((batch,)), eager)


def check_inference_batch_size(host):
    with prepare(tiny_inference(), {"inference.batch_size": 64}, host=host) as run:
        assert run.loader.batch_size == 64 and len(next(iter(run.loader))[0]) == 64
        assert run.workload.batch_size == 32  # the workload itself is unchanged


def check_nproc_per_node(host):
    plan = _trial_plan({"nproc_per_node": 2, "distributed.strategy": "ddp"}, host)
    assert plan.env["OMP_NUM_THREADS"] == str(max(1, host.usable_cores // 2))  # torchrun alone would force 1
    assert "--nproc-per-node=2" in plan.argv  # two ranks: tests/distributed


def check_strategy(host):
    for strategy, wrapper in (("ddp", "DistributedDataParallel"), ("fsdp", "FSDPSequential")):
        with prepare(tiny_mlp(), {"distributed.strategy": strategy}, host=host) as run:
            assert type(run.model).__name__ == wrapper and run.world_size == 1 and run.dist.strategy == strategy
            assert torch.isfinite(run.step(next(iter(run.loader))))
        assert torch.distributed.get_world_size() == 1  # one loopback group for the process, reused by the next prepare()


def check_backend(host):
    with prepare(tiny_mlp(), {"distributed.strategy": "ddp", "distributed.backend": "gloo"}, host=host) as run:
        assert run.dist.backend == "gloo" and torch.distributed.get_backend() == "gloo"


def _ddp(host, **knobs):
    return prepare(tiny_mlp(), {"distributed.strategy": "ddp", **knobs}, host=host)


def check_bucket_cap(host):
    with _ddp(host, **{"ddp.bucket_cap_mb": 5}) as run:
        assert run.model.bucket_bytes_cap == 5 * 1024 * 1024


def check_gradient_as_bucket_view(host):
    with _ddp(host, **{"ddp.gradient_as_bucket_view": True}) as run:
        assert run.model.gradient_as_bucket_view


def check_static_graph(host):
    with _ddp(host, **{"ddp.static_graph": True}) as run:
        assert run.model.static_graph


def check_find_unused_parameters(host):
    with _ddp(host, **{"ddp.find_unused_parameters": True}) as run:
        assert run.model.find_unused_parameters


def check_reshard_after_forward(host):
    for reshard, kind in ((True, "DTensor"), (False, "Parameter")):
        config = {"distributed.strategy": "fsdp", "fsdp.reshard_after_forward": reshard}
        with prepare(tiny_mlp(), config, host=host) as run:
            run.model(next(iter(run.loader))[0])
            assert type(run.model[0].weight).__name__ == kind  # after forward: sharded again, or kept whole


_CLAIM_WORKLOADS.update(dict.fromkeys(("inference.mode", "inference.quantize", "inference.export", "inference.batch_size"),
                                      tiny_inference))


def _claim_workload(name):
    """The workload a knob is checked on: one whose dataset, model or layers the knob acts on."""
    if name in _CLAIM_WORKLOADS:
        return _CLAIM_WORKLOADS[name]()
    return tiny_cnn() if name in ("model.channels_last", "backends.cudnn_benchmark") else tiny_mlp()


CLAIMS = {
    "threads.intra_op": ({"threads.intra_op": 1}, check_threads),
    "system.allocator": ({"system.allocator": "jemalloc"}, check_allocator),
    "system.numa": ({"system.numa": "bind"}, check_numa),
    "data.num_workers": ({"data.num_workers": 2}, check_num_workers),
    "data.pin_memory": ({"data.pin_memory": True}, check_pin_memory),
    "data.prefetch_factor": ({"data.num_workers": 1, "data.prefetch_factor": 4}, check_prefetch_factor),
    "data.persistent_workers": ({"data.num_workers": 1, "data.persistent_workers": True}, check_persistent_workers),
    "precision.amp": ({"precision.amp": "bf16"}, check_amp),
    "precision.matmul": ({"precision.matmul": "high"}, check_matmul_precision),
    "backends.cudnn_benchmark": ({"backends.cudnn_benchmark": True}, check_cudnn_benchmark),
    "model.channels_last": ({"model.channels_last": True}, check_channels_last),
    "compile.mode": ({"compile.mode": "default"}, check_compile),
    "optimizer.impl": ({"optimizer.impl": "fused"}, check_optimizer_impl),
    "model.activation_checkpointing": ({"model.activation_checkpointing": True}, check_activation_checkpointing),
    "data.micro_batch_size": ({"data.micro_batch_size": 4}, check_micro_batch),
    "data.decoder": ({"data.decoder": "simplejpeg"}, check_decoder),
    "data.format": ({"data.format": "shards"}, check_format),
    "inference.mode": ({"inference.mode": "inference_mode"}, check_inference_mode),
    "inference.quantize": ({"inference.quantize": "dynamic_int8"}, check_quantize),
    "inference.export": ({"inference.export": "torchscript"}, check_export),
    "inference.batch_size": ({"inference.batch_size": 64}, check_inference_batch_size),
    "nproc_per_node": ({"nproc_per_node": 2, "distributed.strategy": "ddp"}, check_nproc_per_node),
    "distributed.strategy": ({"distributed.strategy": "fsdp"}, check_strategy),
    "distributed.backend": ({"distributed.strategy": "ddp", "distributed.backend": "gloo"}, check_backend),
    "ddp.bucket_cap_mb": ({"distributed.strategy": "ddp", "ddp.bucket_cap_mb": 5}, check_bucket_cap),
    "ddp.gradient_as_bucket_view": ({"distributed.strategy": "ddp", "ddp.gradient_as_bucket_view": True},
                                    check_gradient_as_bucket_view),
    "ddp.static_graph": ({"distributed.strategy": "ddp", "ddp.static_graph": True}, check_static_graph),
    "ddp.find_unused_parameters": ({"distributed.strategy": "ddp", "ddp.find_unused_parameters": True},
                                   check_find_unused_parameters),
    "fsdp.reshard_after_forward": ({"distributed.strategy": "fsdp", "fsdp.reshard_after_forward": False},
                                   check_reshard_after_forward),
}


def test_every_registered_knob_has_a_claim():
    assert set(CLAIMS) == set(REGISTRY)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_knob_round_trips_through_toml(name, tmp_path):
    config = RunConfig(CLAIMS[name][0])
    path = save_config(config, tmp_path / "torchpace.toml")
    assert dict(load_config(path).values) == dict(config.values)


_HOSTS = {name: faked_host(name) for name in FAKED_HOSTS}


@pytest.mark.parametrize("host_name", sorted(FAKED_HOSTS))
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_knob_describes_itself_and_its_candidates(name, host_name):
    knob, host = REGISTRY[name], _HOSTS[host_name]
    workload = _claim_workload(name)
    assert knob.stage and knob.help and isinstance(knob.point, Point)
    reason = knob.applies(host, workload)
    if reason is None:
        candidates = knob.candidates(host, workload)
        assert candidates[0] == knob.default
        assert all(knob.validate(v) == v for v in candidates)
    else:
        assert isinstance(reason, str) and len(reason) > 10


_COMPILE_POOL = pytest.mark.torch_keeps_threads("torch.compile's inductor keeps its compile worker pool")


def _claim_params():
    """(knob, faked host): every knob under the first faked host, and again under each host where it gets
    another verdict (precision.amp=bf16 applies with native bf16 and is refused without)."""
    for name in sorted(REGISTRY):
        for host_name in hosts_where_verdicts_differ(name, CLAIMS[name][0][name], _claim_workload(name), _HOSTS):
            yield pytest.param(name, host_name, marks=[_COMPILE_POOL] if name == "compile.mode" else [],
                               id=f"{name}-{host_name}")


@pytest.mark.parametrize(("name", "host_name"), list(_claim_params()))
def test_knob_really_changes_what_it_claims(name, host_name, request):
    values, check = CLAIMS[name]
    host = _HOSTS[host_name]
    if name == "system.allocator":
        request.getfixturevalue("system_packages")  # installs jemalloc where apt is available
    knob = REGISTRY[name]
    workload = _claim_workload(name)
    reason = knob.applies(host, workload) or knob.value_applies(values[name], host, workload)
    if reason is not None and knob.point is not Point.ENV:
        with pytest.raises(UsageError, match=name.replace(".", r"\.")):
            prepare(workload, values, host=host)
        pytest.skip(f"does not apply on this host: {reason}")
    check(host)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_process_level_knob_plans_its_own_part_of_a_child(name, host):
    """The child planner names no knob: a knob that takes effect at process start (point ENV, or a
    script reach `process`) plans its own settings, each with a reason; no other knob plans any."""
    knob = REGISTRY[name]
    value = CLAIMS[name][0][name]
    request = ChildRequest(host, {}, "claim.toml", auto=False, config_over_env=True, allowed_cpus=None,
                           install_command=lambda tool: f"install-{tool}")
    process_level = knob.point is Point.ENV or knob.script_reach is Reach.PROCESS
    try:
        part = knob.plan_child(value, None, request, ChildDraft())
    except UsageError as err:  # the value needs a tool this host lacks: refused with how to install it
        assert process_level and "install-" in str(err)
        return
    assert (part is not None) == process_level
    if part is not None:
        assert part.settings and all(s.reason for s in part.settings)
