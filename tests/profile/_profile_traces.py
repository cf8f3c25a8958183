"""Hand-built Chrome trace documents, shaped like torch.profiler's export, for exact analyzer tests.

These are synthetic (the numbers are chosen so the expected figures are exact); the committed traces
under tests/fixtures/profile/ are the real recordings.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "profile"
WORKLOADS = FIXTURES / "workloads.py"
RECORDED = sorted(FIXTURES.glob("*.json.gz"))


def spec(function: str) -> str:
    """The workload spec of a planted workload."""
    return f"{WORKLOADS}:{function}"


def ev(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1, pid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def step(index: int, ts: float, dur: float, tid: int = 1) -> dict:
    return ev(f"ProfilerStep#{index}", ts, dur, cat="user_annotation", tid=tid)


def label(phase: str, ts: float, dur: float, tid: int = 1) -> dict:
    return ev(f"torchpace.{phase}", ts, dur, cat="user_annotation", tid=tid)


def memory(ts: float, total: int, device_type: int = 0) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Total Allocated": total, "Bytes": 1, "Device Type": device_type, "Device Id": 0}}


def document(events: list[dict], metadata: dict | None = None, device_properties: list | None = None) -> dict:
    doc = {"schemaVersion": 1, "traceEvents": events, "deviceProperties": device_properties or []}
    if metadata is not None:
        doc["torchpace"] = metadata
    return doc


def cpu_steps() -> dict:
    """Two 10 ms CPU steps: input 4, h2d 0.5, forward 2, backward 2, optimizer 1 -> other 0.5 ms."""
    events = []
    for i, t0 in enumerate((0.0, 10_000.0)):
        events += [step(i + 2, t0, 10_000), label("input_wait", t0, 4_000), label("h2d", t0 + 4_000, 500),
                   label("forward", t0 + 4_500, 2_000), label("backward", t0 + 6_500, 2_000),
                   label("optimizer", t0 + 8_500, 1_000),
                   ev("aten::mm", t0 + 4_600, 1_500), ev("aten::addmm", t0 + 4_700, 500),  # nested in mm
                   ev("aten::item", t0 + 6_200, 100), ev("aten::_local_scalar_dense", t0 + 6_210, 50),
                   ev("aten::item", t0 + 1_000, 10), ev("aten::item", t0 + 9_000, 10)]  # input/optimizer: CPU scalars
    events.append(ev("aten::mm", 30_000, 5_000))  # outside any step: ignored
    return document(events, metadata={"device": "cpu", "workload": "synthetic", "peak_memory_bytes": 900,
                                      "peak_memory_kind": "cpu_peak_rss", "memory_capacity_bytes": 1000})


def cuda_sync_steps() -> dict:
    """Two 10 ms CUDA steps; a blocking `.item()` of 2 ms each; the GPU busy 4 ms of each step."""
    events = []
    for i, t0 in enumerate((0.0, 10_000.0)):
        events += [step(i + 2, t0, 10_000), label("h2d", t0, 500), label("forward", t0 + 500, 3_000),
                   label("backward", t0 + 3_500, 3_000), label("optimizer", t0 + 6_500, 500),
                   ev("aten::item", t0 + 7_000, 2_000), ev("aten::_local_scalar_dense", t0 + 7_010, 1_980),
                   ev("cudaMemcpyAsync", t0 + 7_100, 100, cat="cuda_runtime"),
                   ev("cudaStreamSynchronize", t0 + 7_200, 1_700, cat="cuda_runtime"),
                   ev("aten::item", t0 + 200, 20),  # a CPU-tensor item: no device copy inside, not a sync
                   ev("ampere_sgemm_128x64_nn", t0 + 500, 2_000, cat="kernel", pid=0, tid=7),
                   ev("ampere_sgemm_128x64_tn", t0 + 3_500, 1_800, cat="kernel", pid=0, tid=7),
                   ev("Memcpy DtoH (Device -> Pageable)", t0 + 7_150, 200, cat="gpu_memcpy", pid=0, tid=7),
                   memory(t0 + 600, 3 * 2**30, device_type=1)]
    props = [{"id": 0, "name": "NVIDIA Test GPU", "totalGlobalMem": 4 * 2**30}]
    return document(events, metadata={"device": "cuda:0", "workload": "synthetic-cuda"}, device_properties=props)


def ddp_steps() -> dict:
    """Two 10 ms CPU steps of a gloo DDP run: 4 ms of each in all-reduce (two overlapping calls)."""
    events = []
    for i, t0 in enumerate((0.0, 10_000.0)):
        events += [step(i + 2, t0, 10_000), label("forward", t0, 3_000), label("backward", t0 + 3_000, 6_000),
                   ev("gloo:all_reduce", t0 + 5_000, 3_000, tid=2), ev("gloo:all_reduce", t0 + 6_000, 3_000, tid=3)]
    return document(events, metadata={"device": "cpu"})
