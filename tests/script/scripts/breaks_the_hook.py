"""Fixture: a sound hand-written SGD loop (no torch.optim optimizer) that plants a fault in torchpace's own
hook, not in itself: once torch is imported (the hook is installed then, when torchpace measures it), the
measurement's step handler raises. With argv[1] == "own", the hook is left alone and the loop raises its
own error at the same step instead."""

import sys

import torch

OWN = len(sys.argv) > 1 and sys.argv[1] == "own"
probe = sys.modules.get("torchpace.script.probe")  # loaded by torchpace's hook at `import torch`
if probe is not None and not OWN:
    def broken_step(self):
        raise RuntimeError("planted fault in torchpace's step handler")

    probe.ScriptProbe.on_step = broken_step

w = torch.zeros(8, 1, requires_grad=True)
for step in range(200):
    x = torch.randn(16, 8)
    if OWN and step == 3:
        raise RuntimeError("planted failure of the script's own")
    loss = (x @ w - x.sum(dim=1, keepdim=True)).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad.zero_()
print("trained 200 steps")
