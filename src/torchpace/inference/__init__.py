"""Inference tuning (docs/design.md#inference): the accuracy guard against the fp32 eager reference,
dynamic int8 quantization and model export (torch.export / TorchScript). The knobs that use these
live in `torchpace.knobs.inference`; `prepare()` applies them. Batch-1 latency is measured by the
meter (`torchpace.measure.latency`).

Submodules are imported lazily by their users (this package imports nothing heavy).
"""
