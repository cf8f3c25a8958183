"""torch.compile as the knobs apply it (`torchpace.engine.compile`): the CUDA-graph modes' shape rule, the
mode's options, and the compiler's cache carried from one process to the next."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from torchpace.engine.compile import ShapeWatch, compile_options, input_signature, uses_cuda_graphs

SCRIPTS = Path(__file__).parents[1] / "script" / "scripts"


def test_a_cuda_graph_mode_fits_fixed_shapes_a_last_short_batch_and_an_eval_batch():
    watch = ShapeWatch("reduce-overhead")
    shapes = [((64, 3, 96, 96),)] * 5 + [((17, 3, 96, 96),), ((256, 3, 96, 96),)] + [((64, 3, 96, 96),)] * 20
    assert [watch.see(shape) for shape in shapes] == [None] * len(shapes)


def test_inputs_that_change_shape_every_call_are_named_within_the_first_calls():
    watch = ShapeWatch("reduce-overhead")
    reasons = [watch.see(((8, length),)) for length in range(100, 108)]
    assert reasons[:3] == [None] * 3
    why = next(reason for reason in reasons if reason)
    assert "compile.mode = reduce-overhead records a CUDA graph per input shape" in why
    assert "changed shape 4 times in the first 4 calls" in why and "max-autotune-no-cudagraphs" in why
    assert watch.see(((8, 999),)) is None  # only the first calls are watched: no cost after them


def test_the_signature_follows_nested_inputs_and_their_dtypes():
    batch = ({"ids": torch.zeros(2, 5, dtype=torch.long)}, [torch.zeros(2, 3)], 7)
    assert input_signature(batch) == (((2, 5), "torch.int64"), ((2, 3), "torch.float32"))


def test_the_modes_and_their_options():
    assert compile_options("default") == {} and compile_options("reduce-overhead") == {"mode": "reduce-overhead"}
    assert uses_cuda_graphs("reduce-overhead") and uses_cuda_graphs("max-autotune")
    assert not uses_cuda_graphs("max-autotune-no-cudagraphs") and not uses_cuda_graphs("default")


@pytest.mark.slow
def test_a_later_compile_of_the_same_model_takes_its_graphs_from_the_compilers_cache(cli_run, tmp_path):
    # two script-mode benches with compile.mode: the second process compiles from the cache the first filled;
    # the script trains on for as long as the bench measures (the bench ends it), whatever the host's speed
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    figures = []
    for _ in range(2):
        done = cli_run("bench", "--max-time", "4", "--json", "--set", "compile.mode=default", "--", "python",
                       str(SCRIPTS / "knob_probe.py"), str(tmp_path / "seen.json"), "100000", env_extra=env, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        figures.append(json.loads(done.stdout)["script"]["compile"])
    first, later = figures
    assert first["cache_misses"] > 0  # compiled afresh (a graph compiled twice in it may hit what it just wrote)
    assert later["cache_hits"] > 0 and later["cache_misses"] == 0
    assert first["compile_s"] > 0 and later["compile_s"] > 0
    assert os.listdir(tmp_path / "inductor")
