"""What `compile.mode` really compiles in an unmodified script, seen by a recording backend.

Installs what a script-mode profile trial with bf16 installs (the autocast and the forward-label
global module hooks) and `torchpace.script.compile.ScriptCompile` with a backend that records every
graph it is given, trains a few steps of a nested model, and prints JSON: the graphs (their call
targets), dynamo's graph-break count, what ScriptCompile reports, and for comparison how many graphs
`nn.Module.compile()` called after the first step produced (argv[1] == "module-compile").
"""

import json
import sys

import torch
from torch import nn

from torchpace.script.autocast import OutermostModule, install_outermost_autocast
from torchpace.script.compile import install_script_compile
from torchpace.script.inprocess import HookReport

graphs = []


def recording_backend(gm, example_inputs):
    calls = {}
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_module", "call_method"):
            name = str(getattr(node.target, "__name__", node.target))
            calls[name] = calls.get(name, 0) + 1
    graphs.append(calls)
    return gm.forward


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.norm = nn.Linear(32, 32), nn.LayerNorm(32)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.linear(x))) + x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.blocks(x))


report = HookReport()
install_outermost_autocast("bf16", report, "precision.amp")
labels = OutermostModule(lambda module: torch.profiler.record_function("torchpace.forward"))
torch.nn.modules.module.register_module_forward_pre_hook(labels.before)
torch.nn.modules.module.register_module_forward_hook(labels.after, always_call=True)
module_compile = sys.argv[1:] == ["module-compile"]
compiled = None if module_compile else install_script_compile(
    "default", report, "compile.mode", compiler=lambda fn, **options: torch.compile(fn, backend=recording_backend, **options))

torch.manual_seed(0)
model, loss_fn = Net(), nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters())
x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
for step in range(4):
    if module_compile and step == 1:
        model.compile(backend=recording_backend)
    loss = loss_fn(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

from torch._dynamo.utils import counters  # noqa: E402

print(json.dumps({"graphs": graphs, "graph_breaks": sum(counters["graph_break"].values()),
                  "compile": compiled.summary() if compiled else None, "warm": compiled.warm if compiled else None,
                  "reached": sorted(report.reached), "output_dtype": str(model(x).dtype)}))
