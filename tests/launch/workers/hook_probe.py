"""An unmodified training script for the sitecustomize hook test: prints (as JSON) the matmul
precision, cudnn.benchmark and what DataLoaders built with and without explicit arguments get."""

import json
import sys

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(4))


class MyLoader(DataLoader):
    def __init__(self, dataset):
        super().__init__(dataset, batch_size=2)


def describe(loader):
    return {k: getattr(loader, k) for k in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size")}


data = TensorDataset(torch.zeros(8, 2))
print(json.dumps({
    "matmul": torch.get_float32_matmul_precision(),
    "cudnn_benchmark": torch.backends.cudnn.benchmark,
    "plain": describe(DataLoader(data)),
    "explicit_kw": describe(DataLoader(data, num_workers=0, pin_memory=False)),
    "explicit_positional": describe(DataLoader(data, 4, False, None, None, 1)),
    "subclass": describe(MyLoader(data)),
    "iterable": describe(DataLoader(Stream())),
    "sitecustomize_marker": getattr(sys.modules.get("chained_marker"), "value", None),
}))
