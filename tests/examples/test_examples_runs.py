"""The `resnet` and `gpt` built-ins run: the small resnet's JPEG folder, and both workloads measured by
`torchpace bench`, as built-ins and as the plain scripts in examples/scripts (the same models)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from torchpace.examples import resnet
from torchpace.examples.sizes import SMALL
from torchpace.workload import load_workload

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "scripts"


@pytest.fixture(scope="module")
def examples_cache(tmp_path_factory):
    """One torchpace cache for this module: the small resnet's images are written once."""
    return tmp_path_factory.mktemp("examples-cache")


def test_resnet_small_reads_a_folder_of_jpegs_of_many_sizes_with_its_own_loader_arguments(examples_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(examples_cache))
    workload = load_workload("resnet-small")
    spec = resnet.RESNET_SIZES[SMALL]
    assert workload.name == "resnet (ResNet-18, 96 px, small)" and workload.batch_size == 32
    assert workload.loader_options == {"num_workers": 4, "pin_memory": torch.cuda.is_available()}
    dataset = workload.dataset
    assert len(dataset) == spec.classes * spec.per_class and len(dataset.classes) == spec.classes
    assert dataset.root.is_relative_to(examples_cache / "torchpace")
    sizes = set()
    for path, _ in dataset.samples[::97]:
        with Image.open(path) as image:
            assert image.format == "JPEG" and all(spec.sides[0] <= side <= spec.sides[1] for side in image.size)
            sizes.add(image.size)
    assert len(sizes) > 5  # photos come in many sizes: the crop is random in size too
    torch.manual_seed(0)
    image, label = dataset[0]
    assert image.shape == (3, 96, 96) and image.is_contiguous() and label == 0
    assert workload.model.fc.out_features == spec.classes


def _bench(cli_run, cache, *args, max_time="8"):
    """`torchpace bench` with one intra-op thread: beside busy processes a step on two threads can slow many-fold
    (a thread waits at a barrier for one that lost its core) and a script's step could outlast --max-time."""
    result = cli_run("bench", "--max-time", max_time, "--json", "--set", "threads.intra_op=1", *args,
                     env_extra={"XDG_CACHE_HOME": str(cache)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.slow
def test_bench_resnet_small_runs_with_its_four_workers_and_names_its_size(cli_run, examples_cache):
    payload = _bench(cli_run, examples_cache, "resnet-small")
    assert payload["workload"] == "resnet (ResNet-18, 96 px, small)" and payload["batch_size"] == 32
    assert payload["samples_per_s"] > 0 and payload["measured_steps"] >= 1
    assert payload["config"]["data.num_workers"] == 4  # the baseline's loader, recorded as it ran


@pytest.mark.slow
def test_bench_gpt_small_runs_and_names_its_size(cli_run, examples_cache):
    payload = _bench(cli_run, examples_cache, "gpt-small")
    assert payload["workload"] == "gpt (GPT 5M, 4x256, 256 tokens, small)" and payload["batch_size"] == 4
    assert payload["samples_per_s"] > 0 and payload["measured_steps"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("script, args", [
    ("resnet_train.py", ("--size", "small", "--batch-size", "4", "--workers", "1")),
    ("gpt_train.py", ("--size", "small", "--batch-size", "2")),
])
def test_the_plain_scripts_train_the_same_models_under_bench(cli_run, examples_cache, script, args):
    payload = _bench(cli_run, examples_cache, "--", "python", str(SCRIPTS / script), *args)
    assert payload["steps_per_s"] > 0 and payload["samples_per_s"] > 0
    assert payload["batch_size"] == int(args[3])  # the script's own batches, counted by the hook


def test_the_image_folders_writers_end_quietly_under_a_commands_stop_policy(tmp_path):
    # the pool ends its workers with SIGTERM; a forked copy of the command's stop policy must not turn that
    # into a worker's traceback on the user's terminal (seen under `bench inference` with a bad --set)
    code = ("import sys, pathlib\n"
            "from torchpace.stop_policy import stop_signals_raise\n"
            "from torchpace.examples.vision import write_jpeg_folder\n"
            "with stop_signals_raise():\n"
            "    for n in range(3):\n"
            "        write_jpeg_folder(pathlib.Path(sys.argv[1]) / str(n), classes=4, per_class=2, sides=(16, 16))\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Terminated" not in done.stderr, done.stderr
    assert len(list((tmp_path / "2").glob("class_*/*.jpg"))) == 8
