"""Analyzers: pure plug-ins that read a parsed `Trace` and return `Finding`s.

Lifecycle: an analyzer is instantiated once and registered (`register`); `run_analyzers(trace)`
calls `analyze(trace)` on each in registry order. `analyze` must not touch the world or mutate the
trace; it returns a list of findings whose ids start with ``profile.<name>``, whose `data` holds the
numbers behind them, one typed record of `profile/figures.py` written as JSON (units in the names: `*_us`,
`*_bytes`, `*_frac`), and an empty list when the trace holds nothing it looks at (no GPU, no collectives). Every registered analyzer
passes the shared conformance test in `tests/profile/test_analyzers.py`.

All shares are of the profiled steps' wall time (`ProfilerStep#N` spans), so they add up the way
the user's loop spends its time.
"""

from __future__ import annotations

import heapq
import statistics
from collections import Counter, defaultdict
from typing import Any, ClassVar, Iterable

from torchpace.findings import Finding, Remedy, Severity
from torchpace.profile.figures import (PHASES, Communication, GpuIdle, HostSync, KernelTime, Memory, OpTime, PhaseTime,
                                       PythonFunction, PythonOverhead, StepSplit, TopKernels, TopOps)
from torchpace.records import from_json, to_json
from torchpace.profile.trace import (
    GPU_CATEGORIES,
    LABEL_PREFIX,
    StepSpan,
    Trace,
    TraceEvent,
    in_step_us,
)

OK, INFO, WARN = Severity.OK, Severity.INFO, Severity.WARN
AREA = "profile"

PHASE_TITLES = {"input_wait": "input wait", "h2d": "host→device copy", "forward": "forward + loss",
                "backward": "backward", "optimizer": "optimizer", "other": "other"}

_TOP_N = 10  # rows in the top-operator and top-kernel tables: enough to see the shape, short to read
_HOST_SYNC_WARN_FRAC = 0.10  # on a GPU, 10% of the step blocked on the device is worth removing
_GPU_IDLE_WARN_FRAC = 0.30  # a GPU idle for 30% of the step has room the host is not feeding
_MEMORY_WARN_FRAC = 0.90  # past 90% of capacity the next larger batch or fragmentation OOMs
_COMM_WARN_FRAC = 0.20  # collectives taking 20% of the step are not hidden behind backward
_PYTHON_WARN_FRAC = 0.30  # a third of the step in interpreted Python: launch/dispatch overhead shows

SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
SYNC_RUNTIME = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"})
_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms", "ProcessGroup")


class Analyzer:
    """Base of every analyzer: set `name` and implement `analyze`.

    `name` is a short snake_case word; findings use ids ``profile.<name>`` or
    ``profile.<name>.<detail>``.
    """

    name: ClassVar[str]

    def analyze(self, trace: Trace) -> list[Finding]:
        """Findings about `trace` (pure; an empty list when there is nothing to say)."""
        raise NotImplementedError

    def finding(self, severity: Severity, title: str, evidence: str, *, detail: str = "",
                remedy: Remedy | None = None, figures: Any = None) -> Finding:
        """A Finding with this analyzer's id and area, its `data` the JSON of `figures` (a record of
        `profile/figures.py`)."""
        finding_id = f"profile.{self.name}" + (f".{detail}" if detail else "")
        return Finding(id=finding_id, severity=severity, title=title, evidence=evidence, remedy=remedy,
                       area=AREA, data=to_json(figures) if figures is not None else {})


def _no_steps(analyzer: Analyzer) -> list[Finding]:
    return [analyzer.finding(WARN, "no profiled steps in the trace",
                             "the trace holds no ProfilerStep#N spans: was it recorded with a schedule and prof.step()?")]


def _ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"


# --- step split ---------------------------------------------------------------------------------


def phase_times_us(trace: Trace, step: StepSpan) -> dict[str, float]:
    """Time per phase in one step, from the `torchpace.<phase>` labels inside it; `other` is the rest.

    The phases partition the step: each instant belongs to the innermost label open then (the one that
    started last), so nested labels are never counted twice. A closure-style optimizer (Lightning's
    automatic optimization calls `optimizer.step(closure)`, and the closure runs forward and backward)
    has its forward and backward counted as forward and backward, and only the rest as optimizer; a
    forward recomputed inside backward (activation checkpointing) counts as forward.
    """
    spans = [(max(event.ts_us, step.ts_us), min(event.end_us, step.end_us), event.name[len(LABEL_PREFIX):])
             for event in trace.events
             if event.cat == "user_annotation" and event.tid == step.tid and event.name.startswith(LABEL_PREFIX)
             and event.name[len(LABEL_PREFIX):] in PHASES]
    times = dict.fromkeys(PHASES, 0.0)
    for start, end, phase in innermost_segments([span for span in spans if span[1] > span[0]]):
        times[phase] += end - start
    times["other"] = max(0.0, step.dur_us - sum(times.values()))
    return times


def innermost_segments(spans: Iterable[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Split `(start, end, name)` spans into disjoint segments, each named after the innermost span
    covering it: the one that started last (of two that started together, the shorter)."""
    ordered = sorted(spans, key=lambda s: (s[0], -s[1]))
    cuts = sorted({t for start, end, _ in ordered for t in (start, end)})
    segments: list[tuple[float, float, str]] = []
    open_spans: list[tuple[float, float, int, str]] = []  # (-start, end, order, name): the innermost first
    index = 0
    for left, right in zip(cuts, cuts[1:]):
        while index < len(ordered) and ordered[index][0] <= left:
            start, end, name = ordered[index]
            heapq.heappush(open_spans, (-start, end, index, name))
            index += 1
        while open_spans and open_spans[0][1] <= left:  # ended: drop the innermost until one covers `left`
            heapq.heappop(open_spans)
        if open_spans:
            name = open_spans[0][3]
            if segments and segments[-1][2] == name and segments[-1][1] == left:
                segments[-1] = (segments[-1][0], right, name)
            else:
                segments.append((left, right, name))
    return segments


class StepSplitAnalyzer(Analyzer):
    """Where each step's wall time goes: input wait, H2D copy, forward, backward, optimizer, other."""

    name = "step_split"

    def analyze(self, trace: Trace) -> list[Finding]:
        if not trace.steps:
            return _no_steps(self)
        per_step = [phase_times_us(trace, step) for step in trace.steps]
        total_us = trace.step_total_us
        phases = {}
        for phase in (*PHASES, "other"):
            phase_us = sum(times[phase] for times in per_step)
            phases[phase] = PhaseTime(phase_us / len(per_step), phase_us / total_us if total_us else 0.0)
        labelled = any(phases[phase].us for phase in PHASES)
        figures = StepSplit(len(trace.steps), total_us / len(trace.steps), statistics.median(s.dur_us for s in trace.steps),
                            labelled, **phases)
        split = ", ".join(f"{PHASE_TITLES[name]} {phase.frac:.0%}" for name, phase in figures.phases.items() if phase.us)
        evidence = f"{len(trace.steps)} steps, {_ms(figures.step_time_us)} each on average: {split}"
        if not labelled:
            return [self.finding(WARN, "step time split: no torchpace.* phase labels in the steps", evidence,
                                 figures=figures)]
        return [self.finding(INFO, "step time split", evidence, figures=figures)]


# --- host syncs ---------------------------------------------------------------------------------


def outermost(events: Iterable[TraceEvent]) -> list[TraceEvent]:
    """The events not nested inside another of `events` on the same thread (time-ordered input)."""
    kept, open_end = [], {}
    for event in sorted(events, key=lambda e: (e.ts_us, -e.dur_us)):
        if event.ts_us < open_end.get(event.tid, float("-inf")):
            continue
        kept.append(event)
        open_end[event.tid] = event.end_us
    return kept


def _starts_in_steps(event: TraceEvent, steps: Iterable[StepSpan]) -> bool:
    return any(step.ts_us <= event.ts_us < step.end_us for step in steps)


_SYNC_REMEDY = Remedy(
    "Do not read device values on the host every step: keep the running loss on the device and call "
    "`.item()` every N steps (or at logging time), and avoid `.cpu()`, `print(tensor)`, `.tolist()` and "
    "Python `if` on tensor values inside the step. Copy inputs from pinned memory with non_blocking=True."
)


_CPU_SCALAR_LABELS = ("torchpace.input_wait", "torchpace.optimizer")  # read CPU-side scalars by design


def _label_spans(trace: Trace, names: Iterable[str]) -> list[tuple[Any, float, float]]:
    wanted = set(names)
    return [(e.tid, e.ts_us, e.end_us) for e in trace.events if e.cat == "user_annotation" and e.name in wanted]


def _inside(event: TraceEvent, spans: Iterable[tuple[Any, float, float]]) -> bool:
    return any(tid == event.tid and start <= event.ts_us and event.end_us <= end for tid, start, end in spans)


def host_sync_events(trace: Trace) -> list[TraceEvent]:
    """The host syncs inside the profiled steps, outermost only (`item` wraps `_local_scalar_dense`).

    On a CUDA trace: CUDA stream/device/event syncs, and `item`/`_local_scalar_dense` calls that
    copy from the device (a `cudaMemcpy*` or sync inside them; on a CPU tensor they wait for
    nothing). On a CPU trace nothing waits for a device, so the `item` calls a GPU run would
    make are counted: those outside input loading and the optimizer, which read CPU-side
    scalars by design (decoding, Adam's step count).
    """
    in_steps = [e for e in trace.events if _starts_in_steps(e, trace.steps)]
    ops = [e for e in in_steps if e.name in SYNC_OPS]
    if trace.device == "cuda":
        runtime = [e for e in in_steps if e.cat == "cuda_runtime" and (e.name in SYNC_RUNTIME or e.name.startswith("cudaMemcpy"))]
        device_ops = [op for op in ops if any(_inside(r, [(op.tid, op.ts_us, op.end_us)]) for r in runtime)]
        return outermost(device_ops + [e for e in runtime if e.name in SYNC_RUNTIME])
    excluded = _label_spans(trace, _CPU_SCALAR_LABELS)
    return outermost(e for e in ops if not _inside(e, excluded))


class HostSyncAnalyzer(Analyzer):
    """Host syncs: `.item()`, `_local_scalar_dense`, CUDA stream/device syncs, device→host copies."""

    name = "host_sync"

    def analyze(self, trace: Trace) -> list[Finding]:
        if not trace.steps:
            return _no_steps(self)
        syncs = host_sync_events(trace)
        dtoh = [e for e in trace.events_in(["gpu_memcpy"]) if "DtoH" in e.name and _starts_in_steps(e, trace.steps)]
        sync_us = in_step_us(syncs, trace.steps)
        total_us, steps = trace.step_total_us, len(trace.steps)
        figures = HostSync(len(syncs), len(syncs) / steps, sync_us / steps, sync_us / total_us if total_us else 0.0,
                           len(dtoh), dict(Counter(e.name for e in syncs)), trace.device == "cuda")
        return [self._finding(figures)]

    def _finding(self, f: HostSync) -> Finding:
        names = ", ".join(f"{n} ×{c}" for n, c in sorted(f.by_name.items())) or "none"
        evidence = (f"{f.sync_per_step:.1f} per step ({names}), {_ms(f.sync_us_per_step)} per step "
                    f"= {f.sync_frac:.1%} of step time; {f.dtoh_copies} device→host copies")
        if f.sync_count == 0 and not f.dtoh_copies:
            return self.finding(OK, "no host syncs in the step", evidence, figures=f)
        if not f.on_gpu:
            return self.finding(INFO, "host syncs counted (on CPU they wait for no device)",
                                evidence + "; on a GPU each would stall the host until the device catches up",
                                remedy=_SYNC_REMEDY, figures=f)
        severity = WARN if f.sync_frac >= _HOST_SYNC_WARN_FRAC else INFO
        return self.finding(severity, "host waits for the GPU inside the step", evidence, remedy=_SYNC_REMEDY, figures=f)


# --- GPU idle -----------------------------------------------------------------------------------


class GpuIdleAnalyzer(Analyzer):
    """Share of step time with no kernel, copy or memset running on the GPU (CUDA traces only)."""

    name = "gpu_idle"

    def analyze(self, trace: Trace) -> list[Finding]:
        if not trace.has_gpu_activity or not trace.steps:
            return []
        busy_us = in_step_us(trace.events_in(GPU_CATEGORIES), trace.steps)
        total_us = trace.step_total_us
        idle_frac = max(0.0, 1.0 - busy_us / total_us) if total_us else 0.0
        figures = GpuIdle(busy_us, total_us, idle_frac)
        evidence = f"the GPU ran nothing for {idle_frac:.0%} of the step time ({_ms(total_us - busy_us)} of {_ms(total_us)})"
        if idle_frac >= _GPU_IDLE_WARN_FRAC:
            remedy = Remedy("The host is not keeping the GPU fed: see the verdict; input loading, host syncs and "
                            "per-kernel launch overhead are the usual causes.")
            return [self.finding(WARN, "GPU idle during the step", evidence, remedy=remedy, figures=figures)]
        return [self.finding(OK, "GPU busy during the step", evidence, figures=figures)]


# --- top operators ------------------------------------------------------------------------------


def self_times_us(events: Iterable[TraceEvent]) -> list[tuple[TraceEvent, float]]:
    """(event, self time) for nested events: each event's duration minus its direct children's."""
    by_tid: dict[Any, list[TraceEvent]] = defaultdict(list)
    for event in events:
        by_tid[event.tid].append(event)
    result = []
    for thread_events in by_tid.values():
        stack: list[list] = []  # [event, children_us]
        for event in sorted(thread_events, key=lambda e: (e.ts_us, -e.dur_us)):
            while stack and event.ts_us >= stack[-1][0].end_us:
                done = stack.pop()
                result.append((done[0], max(0.0, done[0].dur_us - done[1])))
            if stack:
                stack[-1][1] += event.dur_us
            stack.append([event, 0.0])
        result.extend((ev, max(0.0, ev.dur_us - children)) for ev, children in reversed(stack))
    return result


def _top_table(rows: Iterable[tuple[str, float]], total_us: float, record: type) -> tuple:
    """The `_TOP_N` names with the most time, each a `record` (`OpTime`, `KernelTime`): calls, time, share."""
    calls: Counter = Counter()
    time_us: Counter = Counter()
    for name, us in rows:
        calls[name] += 1
        time_us[name] += us
    return tuple(record(name, calls[name], us, us / total_us if total_us else 0.0) for name, us in time_us.most_common(_TOP_N))


class TopOpsAnalyzer(Analyzer):
    """The operators with the most self CPU time in the steps, and on CUDA the longest kernels."""

    name = "top_ops"

    def analyze(self, trace: Trace) -> list[Finding]:
        if not trace.steps:
            return _no_steps(self)
        total_us = trace.step_total_us
        ops = [e for e in trace.events_in(["cpu_op"]) if _starts_in_steps(e, trace.steps)]
        table = _top_table(((e.name, us) for e, us in self_times_us(ops)), total_us, OpTime)
        evidence = "; ".join(f"{r.name} {r.self_frac:.1%}" for r in table[:3]) or "no operators recorded"
        findings = [self.finding(INFO, "top operators by self CPU time", evidence, figures=TopOps(table, total_us))]
        kernels = [e for e in trace.events_in(["kernel"]) if _starts_in_steps(e, trace.steps)]
        if kernels:
            ktable = _top_table(((e.name, e.dur_us) for e in kernels), total_us, KernelTime)
            kevidence = "; ".join(f"{r.name[:60]} {r.total_frac:.1%}" for r in ktable[:3])
            findings.append(self.finding(INFO, "top GPU kernels by time", kevidence, detail="kernels",
                                         figures=TopKernels(ktable, total_us)))
        return findings


# --- memory -------------------------------------------------------------------------------------


def _gpu_capacity_bytes(trace: Trace) -> int | None:
    for props in trace.device_properties:
        if props.get("totalGlobalMem"):
            return int(props["totalGlobalMem"])
    return None


class MemoryAnalyzer(Analyzer):
    """Peak memory against capacity: CUDA max allocated vs the GPU's memory, peak RSS vs host RAM."""

    name = "memory"

    def analyze(self, trace: Trace) -> list[Finding]:
        device = trace.device
        samples = [m.total_allocated_bytes for m in trace.memory if m.device == device]
        profiled_peak = max(samples, default=None)
        peak = trace.metadata.get("peak_memory_bytes") or profiled_peak
        if peak is None:
            return []
        capacity = trace.metadata.get("memory_capacity_bytes") or (_gpu_capacity_bytes(trace) if device == "cuda" else None)
        figures = Memory(device, int(peak), trace.metadata.get("peak_memory_kind", "profiler_allocated"), profiled_peak,
                         capacity, peak / capacity if capacity else None)
        what = f"peak {_gib(peak)} ({figures.peak_kind})"
        if not capacity:
            return [self.finding(INFO, "peak memory (capacity unknown)", what, figures=figures)]
        evidence = f"{what} of {_gib(capacity)} = {figures.peak_frac:.0%} (threshold {_MEMORY_WARN_FRAC:.0%})"
        if figures.peak_frac >= _MEMORY_WARN_FRAC:
            remedy = Remedy("Free memory per step: activation checkpointing, or smaller micro-batches with "
                            "gradient accumulation (the global batch stays the same).")
            return [self.finding(WARN, f"{device} memory nearly full", evidence, remedy=remedy, figures=figures)]
        return [self.finding(OK, f"{device} memory has headroom", evidence, figures=figures)]


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# --- communication ------------------------------------------------------------------------------


def is_collective(event: TraceEvent) -> bool:
    """A collective: an NCCL kernel, or a gloo/NCCL/c10d operator on the host."""
    if event.cat == "kernel":
        return "nccl" in event.name.lower()
    return event.cat in ("cpu_op", "user_annotation") and event.name.startswith(_COMM_PREFIXES)


class CommunicationAnalyzer(Analyzer):
    """Share of step time in collectives (distributed runs; nothing to say for a single process)."""

    name = "communication"

    def analyze(self, trace: Trace) -> list[Finding]:
        comm = [e for e in trace.events if is_collective(e)]
        if not comm or not trace.steps:
            return []
        kernels = [e for e in comm if e.cat == "kernel"]
        timed = kernels or comm  # on a GPU the kernels are the transfer; host-side calls only launch them
        comm_us = in_step_us(timed, trace.steps)
        total_us = trace.step_total_us
        figures = Communication(comm_us / len(trace.steps), comm_us / total_us if total_us else 0.0,
                                dict(Counter(e.name for e in outermost(timed))))
        evidence = f"collectives cover {figures.comm_frac:.0%} of the step ({_ms(figures.comm_us_per_step)} per step)"
        if figures.comm_frac >= _COMM_WARN_FRAC:
            remedy = Remedy("Overlap communication with backward (DDP buckets: ddp.bucket_cap_mb, "
                            "gradient_as_bucket_view), raise the per-process batch, or use fewer, faster links.")
            return [self.finding(WARN, "communication is not hidden behind compute", evidence, remedy=remedy,
                                 figures=figures)]
        return [self.finding(INFO, "communication share", evidence, figures=figures)]


# --- Python overhead ----------------------------------------------------------------------------


class PythonOverheadAnalyzer(Analyzer):
    """Python-side overhead from the cProfile pass the capture stores in the trace's metadata."""

    name = "python_overhead"

    def analyze(self, trace: Trace) -> list[Finding]:
        python = trace.metadata.get("python_profile")
        if not python or not python.get("total_s"):
            return []
        frac = python["python_self_s"] / python["total_s"]
        top = tuple(from_json(PythonFunction, row) for row in list(python.get("top", ()))[:_TOP_N])
        figures = PythonOverhead(frac, python.get("steps"), python["total_s"], top)
        names = "; ".join(f"{row.function} {row.self_s * 1000:.1f} ms" for row in top[:3]) or "none"
        evidence = (f"interpreted Python ran {frac:.0%} of {figures.steps} steps' time "
                    f"(cProfile self time outside C/C++ calls); top: {names}")
        if frac >= _PYTHON_WARN_FRAC:
            remedy = Remedy("Python overhead dominates small steps: a larger batch, or fewer and larger operations "
                            "(what applies here is under the verdict's remedies), moves time from Python to kernels.")
            return [self.finding(WARN, "Python-side overhead is high", evidence, remedy=remedy, figures=figures)]
        return [self.finding(INFO, "Python-side overhead", evidence, figures=figures)]


# --- registry -----------------------------------------------------------------------------------

REGISTRY: dict[str, Analyzer] = {}


def register(analyzer: Analyzer) -> Analyzer:
    """Add an analyzer; its name must be new."""
    if analyzer.name in REGISTRY:
        raise ValueError(f"analyzer {analyzer.name!r} is registered twice")
    REGISTRY[analyzer.name] = analyzer
    return analyzer


for _analyzer in (StepSplitAnalyzer(), HostSyncAnalyzer(), GpuIdleAnalyzer(), TopOpsAnalyzer(),
                  MemoryAnalyzer(), CommunicationAnalyzer(), PythonOverheadAnalyzer()):
    register(_analyzer)


def run_analyzers(trace: Trace, analyzers: Iterable[Analyzer] | None = None) -> list[Finding]:
    """Every analyzer's findings on `trace`, in registry order."""
    findings: list[Finding] = []
    for analyzer in analyzers if analyzers is not None else REGISTRY.values():
        findings.extend(analyzer.analyze(trace))
    return findings
