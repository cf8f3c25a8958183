import pytest
import torch

from torchpace.errors import UsageError, UserCodeError
from torchpace.workload import BUILTIN_WORKLOADS, Workload, load_workload

from _support import FIXTURES


def test_file_spec_builds_a_fresh_workload_each_time():
    spec = f"{FIXTURES / 'workloads.py'}:tiny_mlp"
    first, second = load_workload(spec), load_workload(spec)
    assert isinstance(first, Workload) and first.model is not second.model
    assert first.name == "tiny_mlp"


def test_module_spec_resolves(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    assert load_workload("workloads:tiny_cnn").batch_size == 16


@pytest.mark.parametrize("spec, message", [
    ("no_such_pkg.mod:fn", "no module named 'no_such_pkg.mod'"),
    ("missing/file.py:fn", "file 'missing/file.py' does not exist"),
    ("justaname", "expected 'pkg.module:function'"),
    (f"{FIXTURES / 'workloads.py'}:nope", "has no function 'nope'"),
    (f"{FIXTURES / 'workloads.py'}:not_a_workload", "returned dict, expected a torchpace.Workload"),
])
def test_specs_that_do_not_resolve_say_what_was_expected(spec, message):
    with pytest.raises(UsageError) as err:
        load_workload(spec)
    assert message in str(err.value) and "workload spec" in str(err.value)


def test_exception_in_user_code_carries_their_traceback():
    with pytest.raises(UserCodeError) as err:
        load_workload(f"{FIXTURES / 'workloads.py'}:raises_in_build")
    assert "planted failure while building" in err.value.user_traceback
    assert "workloads.py" in err.value.user_traceback


@pytest.mark.parametrize("name, message", [
    ("model_not_a_module", "Workload.model is a function; expected a torch.nn.Module"),
    ("model_without_parameters", "Workload.model has no trainable parameters"),
    ("dataset_none", "Workload.dataset is None"),
    ("dataset_empty", "Workload.dataset is empty"),
    ("dataset_smaller_than_a_batch", "Workload.dataset has 10 samples, fewer than one batch (batch_size 32)"),
    ("batch_size_zero", "Workload.batch_size is 0; expected a positive int"),
    ("batch_size_float", "Workload.batch_size is 32.0; expected a positive int"),
])
def test_a_workload_of_the_wrong_shape_is_a_usage_error_naming_the_field(name, message):
    with pytest.raises(UsageError) as err:
        load_workload(f"{FIXTURES / 'workloads.py'}:{name}")
    assert message in str(err.value) and name in str(err.value)


def test_sys_exit_while_building_is_reported_as_the_workloads_own_exit(tmp_path):
    planted = tmp_path / "exits.py"
    planted.write_text("import sys\ndef build():\n    sys.exit(4)\n")
    with pytest.raises(UserCodeError) as err:
        load_workload(f"{planted}:build")
    assert "sys.exit(4)" in str(err.value) and "exits.py" in err.value.user_traceback


# `resnet` and `gpt` are their size for this device; the sizes by name are in tests/examples (writing the
# full resnet's 8,000 images here would take a minute on a small host)
@pytest.mark.parametrize("name", sorted(n for n in BUILTIN_WORKLOADS if not n.endswith(("-small", "-full"))))
def test_builtins_build_locally_and_deterministically(name, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    a, b = load_workload(name), load_workload(name)
    torch.manual_seed(0)  # vision augments at random: the same seed must give the same sample
    first_a = a.dataset[0]
    torch.manual_seed(0)
    first_b = b.dataset[0]
    assert (first_a[0] == first_b[0]).all()
    assert a.is_training == (name != "inference")
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert (pa == pb).all()
    if name in ("vision", "inference", "resnet"):
        jpegs = list((tmp_path / "torchpace").rglob("*.jpg"))
        assert len(jpegs) == len(a.dataset) and jpegs[0].read_bytes()[:2] == b"\xff\xd8"


# ---- a user who arrives with a train.py --------------------------------------------------------

_TRAIN_PY = '''
import argparse
import torch

class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=0)
    args = parser.parse_args()
    return None
'''


def test_a_file_without_a_function_suggests_script_mode(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TRAIN_PY)
    with pytest.raises(UsageError, match=r"-- python .*train.py ARGS"):
        load_workload(str(script))


@pytest.mark.parametrize("spec, command", [
    ("python train_pl.py", "python train_pl.py"),  # a script study's command, as the report once offered it
    ("python3 -m pkg.train --epochs 2", "python3 -m pkg.train --epochs 2"),
    ("train_pl.py --epochs 2", "python train_pl.py --epochs 2"),
])
def test_a_command_given_as_a_workload_points_to_script_mode_with_that_command(spec, command):
    with pytest.raises(UsageError) as err:
        load_workload(spec)
    assert f"`torchpace bench -- {command}`" in str(err.value) and "python python" not in str(err.value)


def test_a_function_that_is_not_a_workload_sees_its_own_argv_and_is_pointed_to_script_mode(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(_TRAIN_PY)
    monkeypatch.setattr("sys.argv", ["torchpace", "bench", f"{script}:main", "--max-time", "3"])
    with pytest.raises(UsageError, match=r"returned NoneType.*script mode: `torchpace bench -- python .*train.py ARGS`"):
        load_workload(f"{script}:main")  # argparse in main() saw [train.py], not torchpace's arguments
    import sys

    assert sys.argv[:2] == ["torchpace", "bench"]


def test_a_workload_file_imports_its_neighbours(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(_TRAIN_PY)
    (tmp_path / "tp_workload.py").write_text(
        "import torch, torchpace\nfrom train import SmallNet\n"
        "def make():\n    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))\n"
        "    return torchpace.Workload(model=SmallNet(), dataset=data, batch_size=4,\n"
        "                              loss=lambda out, batch: torch.nn.functional.cross_entropy(out, batch[1]))\n")
    monkeypatch.chdir(tmp_path.parent)  # not the file's folder: its folder must come from the spec
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # restored after the test
    try:
        assert load_workload(f"{tmp_path / 'tp_workload.py'}:make").batch_size == 4
    finally:
        __import__("sys").modules.pop("train", None)
