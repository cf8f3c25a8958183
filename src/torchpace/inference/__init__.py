"""Inference tuning (docs/design.md#inference): batch-1 latency percentiles, the accuracy guard
against the fp32 eager reference, dynamic int8 quantization and model export (torch.export /
TorchScript). The knobs that use these live in `torchpace.knobs.inference`; `prepare()` applies them.

Submodules are imported lazily by their users (this package imports nothing heavy).
"""
