"""`precision.amp = fp16` in an unmodified script (`torchpace.script.scaler`), against the hand-written recipe.

argv[1] is `hook` (a plain fp32 training loop with torchpace's fp16 autocast and GradScaler placed from
outside, as the launch hook does) or `hand` (the same loop written with torch.autocast and
torch.amp.GradScaler by hand, as the AMP recipe says); argv[2] the loop: `plain`, `clip` (gradient
clipping), `closure` (`optimizer.step(closure)`), `inf` (one step's gradients overflow), `two` (two
optimizers, each with its own loss), `accumulate` (two backward() per step), `own-scaler` (the script
builds its own GradScaler), `lbfgs`. Prints JSON: the losses, a checksum of the parameters, the output's and the
first layer's dtypes, the scale, and what the hook reported. Runs on the CPU (torch's CPU autocast and GradScaler take fp16 there too).
"""

import json
import sys

import torch
from torch import nn

mode, loop = sys.argv[1], sys.argv[2]
report = None
if mode == "hook":
    from torchpace.script.autocast import install_outermost_autocast
    from torchpace.script.inprocess import HookReport
    from torchpace.script.scaler import install_script_scaler

    report = HookReport()
    scaler_hook = install_script_scaler(report, "precision.amp")
    install_outermost_autocast("fp16", report, "precision.amp", refused=lambda: scaler_hook.refused)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
second = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
data = [(torch.randn(32, 16), torch.randint(0, 4, (32,))) for _ in range(12)]
if loop == "inf":
    data[3] = (data[3][0] * 6e4, data[3][1])  # fp16 overflows in this step's forward: its gradients are inf
scaler = torch.amp.GradScaler("cpu") if mode == "hand" or loop == "own-scaler" else None
optimizer = (torch.optim.LBFGS if loop == "lbfgs" else torch.optim.SGD)(model.parameters(), lr=0.05)
other = torch.optim.SGD(second.parameters(), lr=0.05) if loop == "two" else None
seen_dtypes = []
inner_dtypes = set()
model[0].register_forward_hook(lambda module, args, out: inner_dtypes.add(str(out.dtype)))


def forward(net, x):
    if mode == "hand":
        with torch.autocast("cpu", dtype=torch.float16):
            out = net(x)
        return out.float()  # as the hook gives it back
    return net(x)


def backward(loss):
    (scaler.scale(loss) if mode == "hand" else loss).backward()


def step(opt):
    if mode == "hand":
        scaler.step(opt)
    else:
        opt.step()


losses = []
for x, y in data:
    out = forward(model, x)
    seen_dtypes.append(str(out.dtype))
    loss = nn.functional.cross_entropy(out, y)
    if loop == "closure":
        def closure():
            optimizer.zero_grad()
            inner = nn.functional.cross_entropy(forward(model, x), y)
            backward(inner)
            return inner
        if mode == "hand":  # Lightning's recipe for a closure: run it, then the scaler's step without it
            closure()
            scaler.step(optimizer)
        else:
            optimizer.step(closure)
    elif loop == "lbfgs":
        optimizer.step(lambda: loss)
        break
    else:
        optimizer.zero_grad()
        if loop == "accumulate":
            half = nn.functional.cross_entropy(forward(model, x[:16]), y[:16]) / 2
            backward(half)
            backward(nn.functional.cross_entropy(forward(model, x[16:]), y[16:]) / 2)
        else:
            backward(loss)
        if loop == "clip":
            if mode == "hand":
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        step(optimizer)
        if loop == "two":
            other.zero_grad()
            backward(forward(second, forward(model, x).detach()).pow(2).mean())
            step(other)
    if mode == "hand":
        scaler.update()
    losses.append(loss.item())

checksum = sum(float(p.detach().double().sum()) for net in (model, second) for p in net.parameters())
print(json.dumps({"losses": losses, "checksum": checksum, "dtypes": seen_dtypes, "inner": sorted(inner_dtypes),
                  "scale": float(scaler.get_scale()) if mode == "hand" else scaler_hook.summary()["scale"],
                  "refused": scaler_hook.refused if report else None,
                  "not_applied": report.not_applied if report else None,
                  "reached": sorted(report.reached) if report else None}))
