"""A small unmodified DDP script, run under torchrun: each rank writes, at its first optimizer step, the settings
its DistributedDataParallel was built with to argv[1].rankR (JSON), then trains argv[2] steps (default 20), and
adds, under "after", what saving, copying, evaluating, tracing and exporting the trained model (`model.module`)
and one more step through the DDP did (`after_training.life_after`, in a folder of its rank's).

It passes `find_unused_parameters=True` and `bucket_cap_mb=50` itself (the Hugging Face Trainer passes the first
by default), so a knob that reaches it must replace the script's own argument."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from after_training import life_after
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x):
        return self.body(x)


dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True, bucket_cap_mb=50)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
for step in range(steps):
    optimizer.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    optimizer.step()
    if step == 0:
        seen = {"bucket_cap_mb": model.bucket_bytes_cap // (1024 * 1024),
                "gradient_as_bucket_view": model.gradient_as_bucket_view, "static_graph": model.static_graph,
                "find_unused_parameters": model.find_unused_parameters, "world_size": dist.get_world_size()}
        with open(f"{sys.argv[1]}.rank{rank}", "w") as f:
            json.dump(seen, f)
folder = Path(f"{sys.argv[1]}.after{rank}")
folder.mkdir(exist_ok=True)
seen["after"] = life_after(model.module, torch.randn(4, 8), folder, trainer=model)
with open(f"{sys.argv[1]}.rank{rank}", "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
