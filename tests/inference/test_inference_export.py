"""Export: artifacts written by `export_workload` load in a fresh process and reproduce the outputs;
a format the model does not support fails with the exporter's own error."""

import subprocess
import sys
import textwrap

import pytest
import torch

from torchpace.inference.capture import ExportFailed, read_artifact_format
from torchpace.tune.export import export_workload
from torchpace.runtime import prepare

from inference_planted import branchy, wide_mlp

_LOAD_AND_RUN = textwrap.dedent("""
    import sys, torch
    path, inputs, outputs, fmt = sys.argv[1:]
    model = torch.export.load(path).module() if fmt == "torch_export" else torch.jit.load(path)
    with torch.no_grad():
        torch.save(model(torch.load(inputs)), outputs)
""")


def _outputs_in_fresh_process(path, fmt, inputs, tmp_path):
    """Load the artifact with plain torch (no torchpace) in a new interpreter and run it on `inputs`."""
    torch.save(inputs, tmp_path / "inputs.pt")
    subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, str(path), str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt"), fmt],
                   check=True, capture_output=True, timeout=120)
    return torch.load(tmp_path / "out.pt")


def _prepared_outputs(config, inputs, host):
    with prepare(wide_mlp(), config, host=host) as run, torch.no_grad():
        return run.model(inputs)


@pytest.mark.parametrize("config, fmt, suffix", [
    ({"inference.export": "torch_export"}, "torch_export", "pt2"),
    ({"inference.quantize": "dynamic_int8", "inference.export": "torchscript"}, "torchscript", "pt"),
])
def test_exported_artifact_reproduces_the_prepared_outputs_in_a_fresh_process(config, fmt, suffix, host, tmp_path):
    path = tmp_path / f"model.{suffix}"
    info = export_workload(wide_mlp(), config, path, host=host)
    assert info.format == fmt == read_artifact_format(path) and info.size_bytes == path.stat().st_size
    assert info.max_abs_diff < 1e-4 and info.fallback_reason is None  # float rounding at most (logits ~10)
    inputs = wide_mlp().dataset.tensors[0][:5]  # batch 5: not the example batch the exporter traced
    torch.testing.assert_close(_outputs_in_fresh_process(path, fmt, inputs, tmp_path), _prepared_outputs(config, inputs, host),
                               rtol=1e-5, atol=1e-4)


def test_channels_last_is_listed_for_the_servers_inputs_and_quantization_is_not():
    from torchpace.config import RunConfig
    from torchpace.tune.export import runtime_settings

    assert runtime_settings(RunConfig({"model.channels_last": True, "inference.quantize": "dynamic_int8"})) == {
        "model.channels_last": True}


def test_runtime_knobs_are_listed_not_baked_in(host, tmp_path):
    info = export_workload(wide_mlp(), {"inference.mode": "inference_mode", "threads.intra_op": 1}, tmp_path / "m.pt2", host=host)
    assert info.runtime == {"inference.mode": "inference_mode", "threads.intra_op": 1} and info.format == "torch_export"


def test_a_format_the_model_cannot_take_fails_with_the_exporters_error(host):
    with pytest.raises(ExportFailed, match=r"torch\.export failed for this model: GuardOnDataDependentSymNode"):
        prepare(branchy(), {"inference.export": "torch_export"}, host=host)
    with prepare(branchy(), {"inference.export": "torchscript"}, host=host) as run:
        assert isinstance(run.model, torch.jit.ScriptModule)


def test_an_open_format_falls_back_to_torchscript_and_says_why(host, tmp_path):
    info = export_workload(branchy(), {}, tmp_path / "model.pt", host=host)
    assert info.format == "torchscript" and "torch.export failed" in info.fallback_reason
    assert info.max_abs_diff < 1e-4
