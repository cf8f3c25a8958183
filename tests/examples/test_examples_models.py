"""The `resnet` and `gpt` built-ins' models, data streams and sizes (no image folder is written here)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from torchpace.examples import gpt, resnet
from torchpace.examples.sizes import FULL, SMALL, size_for
from torchpace.workload import BUILTIN_WORKLOADS, load_workload

TORCHVISION_TOP_LEVEL = ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool", "fc"]


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("build, count", [(resnet.resnet50, 25_557_032), (resnet.resnet18, 11_689_512)])
def test_resnets_have_torchvisions_parameter_counts_and_module_names(build, count):
    model = build(1000)
    assert _parameters(model) == count
    assert [name for name, _ in model.named_children()] == TORCHVISION_TOP_LEVEL
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_resnets_have_torchvisions_state_dict_keys_and_shapes(arch):
    models = pytest.importorskip("torchvision.models", reason="torchvision is not installed: its resnet18/resnet50 "
                                 "are the reference this comparison needs")
    theirs, ours = getattr(models, arch)(), getattr(resnet, arch)(1000)
    assert _parameters(theirs) == _parameters(ours)
    assert {k: v.shape for k, v in theirs.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}


def test_the_size_follows_the_device_full_on_a_gpu_small_on_a_cpu():
    assert size_for(cuda_available=True) == FULL and size_for(cuda_available=False) == SMALL


def test_every_size_has_a_built_in_name_and_the_plain_names_follow_the_device():
    for family in ("resnet", "gpt"):
        assert BUILTIN_WORKLOADS[family] == f"torchpace.examples.{family}:workload"
        for size in (SMALL, FULL):
            assert BUILTIN_WORKLOADS[f"{family}-{size}"] == f"torchpace.examples.{family}:{size}"
    here = size_for(torch.cuda.is_available())
    assert gpt.workload().name == gpt.build_workload(here).name  # the built one says which size ran


def test_the_names_say_which_size_ran():
    assert resnet.RESNET_SIZES[SMALL].label == "resnet (ResNet-18, 96 px, small)"
    assert resnet.RESNET_SIZES[FULL].label == "resnet (ResNet-50, 224 px, full)"
    assert gpt.GPT_SIZES[SMALL].name == "gpt (GPT 5M, 4x256, 256 tokens, small)"
    assert gpt.GPT_SIZES[FULL].name == "gpt (GPT-2 124M, 12x768, 1024 tokens, full)"
    with pytest.raises(ValueError, match="resnet size 'medium' is not one of small, full"):
        resnet.build_workload("medium")


@pytest.fixture(scope="module")
def gpt_full():
    """The `gpt-full` workload (124M parameters: built once for the tests that read it)."""
    return load_workload("gpt-full")


def test_gpt_full_is_gpt2_small_with_a_tied_head(gpt_full):
    model = gpt_full.model
    assert _parameters(model) == 124_475_904  # GPT-2's 124,439,808 with the vocabulary padded to 50,304
    assert model.lm_head.weight is model.transformer.wte.weight
    assert _parameters(gpt.GPT(gpt.GPT_SIZES[SMALL])) == 5_322_240


def test_gpt_attends_only_to_earlier_tokens():
    model = gpt.build_model(SMALL).eval()
    tokens = torch.randint(0, 8192, (2, 32))
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 8192
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert before.shape == (2, 32, 8192)
    assert torch.allclose(before[:, :20], after[:, :20], atol=1e-5) and not torch.allclose(before[:, 20:], after[:, 20:])


def test_the_token_stream_is_mostly_predictable_from_its_context():
    stream = gpt.TokenStream(vocab_size=8192, block_size=64, n_tokens=2**18)
    x, y = stream[3]
    assert torch.equal(x[1:], y[:-1]) and len(stream) == (2**18 - 1) // 64
    tokens = stream.tokens.tolist()
    follows = Counter(zip(tokens, tokens[1:], tokens[2:]))  # the next token after each pair of tokens
    best = Counter()
    for (a, b, c), n in follows.items():
        best[(a, b)] = max(best[(a, b)], n)
    predictable = sum(best.values()) / (len(tokens) - 2)
    assert predictable > 0.75  # the first token of a phrase and the corrupted ones are the guesses
    assert torch.equal(gpt.TokenStream(8192, 64, 4096).tokens, gpt.TokenStream(8192, 64, 4096).tokens)


def test_gpt_full_is_built_as_nanogpt_trains_it(gpt_full):
    workload = gpt_full
    assert workload.name.endswith("full)") and workload.batch_size == 16 and workload.clip_grad_norm == 1.0
    tokens, targets = workload.dataset[0]
    assert tokens.shape == targets.shape == (1024,)
    optimizer = workload.optimizer(workload.model.parameters())
    assert isinstance(optimizer, torch.optim.AdamW) and not optimizer.defaults["fused"]
    assert optimizer.defaults["lr"] == 6e-4 and optimizer.defaults["betas"] == (0.9, 0.95)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert workload.loader_options == {"pin_memory": torch.cuda.is_available()}


def test_resnet_full_is_resnet50_on_224_px_crops_with_the_reference_optimizer():
    spec = resnet.RESNET_SIZES[FULL]
    assert (spec.arch, spec.crop, spec.batch_size) == ("resnet50", 224, 256)
    model = resnet.build_model(FULL)
    assert model.fc.out_features == spec.classes == 100
    optimizer = resnet.make_optimizer(model.parameters())
    assert isinstance(optimizer, torch.optim.SGD)
    assert {k: optimizer.defaults[k] for k in ("lr", "momentum", "weight_decay")} == {
        "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
