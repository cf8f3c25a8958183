"""A small unmodified training script that reports, from inside, what each script-mode knob changed.

At its first optimizer step it writes JSON to the path in argv[1]: threads, matmul precision, cuDNN
autotune, its DataLoader's and optimizer's settings, whether the forward ran under autocast and in
which dtype the output came back, and which allocator library is mapped into the process, and whether its conv weights and 4-D inputs are
in channels_last. Then it
trains on (argv[2] steps, default 40) and adds whether torch.compile traced its forward, and, under "after", what
saving, copying, evaluating, tracing and exporting the trained model did (`after_training.life_after`).
"""

import json
import sys
from pathlib import Path

import torch
from after_training import life_after
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
        self.seen = {}

    def forward(self, images):  # images: (batch, 2, 2, 4)
        if not self.training:  # evaluated, traced or exported after training: nothing more to record
            return self.body(torch.flatten(self.conv(images) + images, 1))
        if torch.compiler.is_compiling():  # torch.compile is tracing this forward
            self.seen["compiled"] = True
        else:
            self.seen["input_channels_last"] = not images.is_contiguous() and images.is_contiguous(
                memory_format=torch.channels_last)
            self.seen["conv_channels_last"] = not self.conv.weight.is_contiguous()
        x = torch.flatten(self.conv(images) + images, 1)
        self.seen["autocast"] = torch.is_autocast_enabled(x.device.type)
        self.seen["inner_dtype"] = str(self.body[0](x).dtype)
        return self.body(x)


def loaded_allocator():
    with open("/proc/self/maps") as f:
        maps = f.read()
    return next((name for name in ("jemalloc", "tcmalloc") if f"lib{name}" in maps), "system")


torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 2, 2, 4), torch.randint(0, 2, (512,)))
loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=0)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=False)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
done = 0
while done < steps:
    for x, y in loader:
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if done == 0:
            report = {"threads": torch.get_num_threads(), "matmul": torch.get_float32_matmul_precision(),
                      "cudnn_benchmark": torch.backends.cudnn.benchmark, "num_workers": loader.num_workers,
                      "prefetch_factor": loader.prefetch_factor, "persistent_workers": loader.persistent_workers,
                      "pin_memory": loader.pin_memory, "fused": optimizer.defaults.get("fused"),
                      "foreach": optimizer.defaults.get("foreach"), "output_dtype": str(out.dtype),
                      "autocast_in_step": torch.is_autocast_enabled("cpu"), "allocator": loaded_allocator(),
                      "affinity": sorted(__import__("os").sched_getaffinity(0)), **model.seen}
            with open(sys.argv[1], "w") as f:
                json.dump(report, f)
        done += 1
        if done >= steps:
            break
with open(sys.argv[1]) as f:  # what only shows after the first step: compile.mode compiles after it
    report = json.load(f)
compiled = model.seen.get("compiled", False)
after = life_after(model, torch.randn(8, 2, 2, 4), Path(sys.argv[1]).parent)
with open(sys.argv[1], "w") as f:
    json.dump({**report, "compiled": compiled, "after": after}, f)
