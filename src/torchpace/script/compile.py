"""`compile.mode` in an unmodified script: the model is compiled in place after the script's first backward().

The launch hook cannot edit the script, so it finds the model the way bf16 autocast does
(`torchpace.script.autocast.OutermostModule`: a module with parameters called while no other module's
forward runs in this thread). Every such module with trainable parameters that the script called up to
the end of its first `backward()` is compiled then, in place, by giving the instance a compiled
forward (`module.forward = torch.compile(module.forward, mode=...)`): the script keeps calling the same
object, its `__call__` still runs the global hooks eagerly around it, and every later call runs the
compiled code. (On torch 2.13 `nn.Module.compile()` after the first call left the model uncompiled — a
recording backend saw no graph — and compiling `__call__` would trace the global module hooks of the
measurement into the graph.) The first step therefore runs eagerly; compilation happens in the next
forward and backward, and a script-mode measurement starts only once a backward has completed after the
first compiled forward (`warm`), so its warm-up never holds compile time.

The compiled forward is an attribute of the instance, which the module's own class does not know: pickling
(`torch.save(model)`, `pickle.dumps`, a model handed to `mp.spawn` or a DataLoader worker) and
`copy.deepcopy` would try to save it by name and fail ("it's not the same object as Net.forward"). So
`nn.Module.__getstate__` leaves torchpace's compiled forward out (`_keep_pickling`, once per process, as
torch itself leaves out `_compiled_call_impl`): what is saved and loaded is the script's own model with its
class's forward, and a deep copy (an EMA model) runs eagerly, as the script's own copy would. A
`torch.jit.trace` of the model (also inside `torch.onnx.export`) traces the class's own forward: dynamo's
compiled code cannot be traced by the JIT ("Detected that you are using FX to torch.jit.trace a
dynamo-optimized function").

The global module hooks torchpace installs (autocast, profile labels, this finder) return at once while
torch.compile traces, so they add nothing to the graph and break nothing; the graphs and graph breaks
dynamo counted in this process are reported (`summary`). A model that cannot be compiled (dynamo or
inductor raise at its first compiled call) runs eagerly again from that call, and the knob is recorded
as not applied with the compiler's reason: a script-mode trial ends as `invalid` naming it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from typing import Any

from torchpace.script.autocast import OutermostModule

_BREAK_REASONS_SHOWN = 5  # the most frequent graph-break reasons reported, first line of each
_COMPILED_MARK = "_torchpace_compiled_forward"  # set on the forward torchpace gives a module instance


def _keep_pickling() -> None:
    """Make `nn.Module.__getstate__` leave torchpace's compiled forward out of a module's state (once)."""
    import torch

    original = torch.nn.Module.__getstate__
    if getattr(original, _COMPILED_MARK, False):
        return

    @functools.wraps(original)
    def __getstate__(self):
        state = original(self)
        if getattr(state.get("forward"), _COMPILED_MARK, False):
            state = dict(state)
            del state["forward"]
        return state

    setattr(__getstate__, _COMPILED_MARK, True)
    torch.nn.Module.__getstate__ = __getstate__

class ScriptCompile:
    """Finds the script's model, compiles it after the first backward(), and reports what happened.

    Attributes:
        mode: the compile.mode value (`default`, `max-autotune`, ...).
        modules: names of the modules compiled, in the order the script first called them.
        failure: why compiling failed (None while it has not).
        warm: a backward() completed after the first compiled forward returned (compilation is over).
    """

    def __init__(self, mode: str, report, knob_name: str, compiler=None):
        self.mode, self.report, self.knob_name = mode, report, knob_name
        self.compiler = compiler  # torch.compile unless given (tests pass one with a recording backend)
        self.seen: dict[int, Any] = {}
        self.already: list[str] = []  # outermost modules the script compiled itself
        self.modules: list[str] = []
        self.triggered = False
        self.compiled_calls = 0
        self.failure: str | None = None
        self.warm = False
        self.compile_started_s: float | None = None  # perf_counter at the first compiled call
        self.compile_s: float | None = None  # from then until the backward after it ended (compilation)
        self._lock = threading.Lock()

    # ---- the hooks ---------------------------------------------------------------------------------
    def install(self) -> "ScriptCompile":
        """Register the global forward hooks and the backward() wrapper for the rest of the process."""
        import torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        finder = OutermostModule(self._saw)
        register_module_forward_pre_hook(finder.before)
        register_module_forward_hook(finder.after, always_call=True)
        original = torch.autograd.backward

        @functools.wraps(original)
        def backward(*args, **kwargs):
            result = original(*args, **kwargs)
            self.on_backward()
            return result

        torch.autograd.backward = backward
        return self

    def _saw(self, module):
        """An outermost module was called: remember it until the compile happens (one the script compiled
        itself, `torch.compile(model)` or `model.compile()`, is noted and left as it is)."""
        if not self.triggered and id(module) not in self.seen and _trainable(module):
            if _compiled_by_script(module):
                self.already.append(type(getattr(module, "_orig_mod", module)).__name__)
            else:
                self.seen[id(module)] = module
        return contextlib.nullcontext()

    def on_backward(self) -> None:
        """The first backward() compiles what was called; a later one after a compiled forward ends the warm-up."""
        if not self.triggered:
            self.compile_seen()
        elif self.compiled_calls and not self.warm:
            self.warm = True
            self.compile_s = time.perf_counter() - self.compile_started_s

    def compile_seen(self) -> None:
        """Give each module seen so far a compiled forward (once)."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from torchpace.engine.compile import compile_options, mark_cuda_graph_step, uses_cuda_graphs

        with self._lock:
            if self.triggered:
                return
            self.triggered = True
        compiler = self.compiler or torch.compile
        options = compile_options(self.mode)
        if uses_cuda_graphs(self.mode):
            register_optimizer_step_post_hook(lambda optimizer, args, kwargs: mark_cuda_graph_step())
        if self.seen:
            _keep_pickling()
        for module in self.seen.values():
            module.forward = self._compiled_forward(module, compiler(module.forward, **options))
            self.modules.append(type(module).__name__)
        self.seen.clear()
        if self.modules:
            self.report.reached.add(self.knob_name)
            sys.stderr.write(f"torchpace: compiling {', '.join(self.modules)} in place after the first backward() "
                             f"({self.knob_name} = {self.mode})\n")
        elif self.already:  # nothing left to compile: the script's own torch.compile decides
            self.failure = (f"the script compiles {', '.join(self.already)} itself (torch.compile); "
                            f"{self.knob_name} leaves that model as the script compiled it")
            self.report.not_applied[self.knob_name] = self.failure
            sys.stderr.write(f"torchpace: {self.failure}\n")

    def _compiled_forward(self, module, compiled):
        from torch._dynamo.exc import TorchDynamoException
        from torch.jit import is_tracing

        from torchpace.engine.compile import ShapeWatch, input_signature, uses_cuda_graphs

        eager = module.forward
        watch = ShapeWatch(self.mode) if uses_cuda_graphs(self.mode) and _on_cuda(module) else None

        @functools.wraps(eager)
        def forward(*args, **kwargs):
            if self.failure is not None or is_tracing():  # the script's torch.jit.trace traces its own forward
                return eager(*args, **kwargs)
            why = watch.see(input_signature((args, kwargs))) if watch is not None else None
            if why is not None:  # CUDA graphs would be recorded again for most calls: this mode does not fit
                self.fail(module, why)
                module.forward = eager
                return eager(*args, **kwargs)
            if self.compile_started_s is None:
                self.compile_started_s = time.perf_counter()
            try:
                output = compiled(*args, **kwargs)
            except TorchDynamoException as err:  # the compiler's failure, not the model's: run it eagerly
                self.fail(module, err)
                module.forward = eager
                return eager(*args, **kwargs)
            self.compiled_calls += 1
            return output

        setattr(forward, _COMPILED_MARK, True)
        return forward

    def fail(self, module, err: BaseException | str) -> None:
        """Record that `module` could not be compiled, and why (the first lines of the compiler's error, or
        the reason the mode does not fit it)."""
        if isinstance(err, str):
            self.failure = f"{type(module).__name__} was not compiled: {err}"
        else:
            lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
            why = "; ".join(lines[:2])[:400] or type(err).__name__
            self.failure = f"{type(module).__name__} could not be compiled ({type(err).__name__}): {why}"
        self.report.reached.discard(self.knob_name)
        self.report.not_applied[self.knob_name] = self.failure
        sys.stderr.write(f"torchpace: {self.failure}; it runs without compile\n")

    # ---- the report ----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """What was compiled, and the graphs and graph breaks dynamo counted in this process."""
        from torch._dynamo.utils import counters

        breaks = counters.get("graph_break", {})
        reasons = sorted(breaks.items(), key=lambda item: -item[1])[:_BREAK_REASONS_SHOWN]
        inductor = counters.get("inductor", {})
        return {"mode": self.mode, "modules": list(self.modules), "compiled_calls": self.compiled_calls,
                "graphs": int(counters.get("stats", {}).get("unique_graphs", 0)),
                "graph_breaks": int(sum(breaks.values())),
                "break_reasons": {str(reason).strip().splitlines()[0][:200]: count for reason, count in reasons},
                "compile_s": self.compile_s, "cache_hits": int(inductor.get("fxgraph_cache_hit", 0)),
                "cache_misses": int(inductor.get("fxgraph_cache_miss", 0)), "failure": self.failure}


def _on_cuda(module) -> bool:
    return any(parameter.is_cuda for parameter in module.parameters())


def _trainable(module) -> bool:
    return any(parameter.requires_grad for parameter in module.parameters())


def _compiled_by_script(module) -> bool:
    """`torch.compile(model)` (an OptimizedModule wrapping it) or `model.compile()` in the script."""
    return hasattr(module, "_orig_mod") or getattr(module, "_compiled_call_impl", None) is not None


def install_script_compile(mode: str, report, knob_name: str, compiler=None) -> ScriptCompile:
    """Compile the script's model after its first backward(); `report` gets what happened (and the
    `ScriptCompile` as `report.compiled`: the measurement waits for it).

    Args:
        compiler: `torch.compile` unless given (a test passes one with a recording backend).
    """
    report.compiled = ScriptCompile(mode, report, knob_name, compiler).install()
    return report.compiled
