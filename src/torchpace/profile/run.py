"""`profile_workload`: load a workload, capture its profile, analyze it (the `torchpace profile` flow)."""

from __future__ import annotations

import time
from pathlib import Path

from torchpace.config import RunConfig
from torchpace.errors import UsageError
from torchpace.files import OutputWriteFailed
from torchpace.host import HostFacts, probe_host
from torchpace.knobs.system import fix_glibc_thresholds
from torchpace.measure.contention import measure_other_load
from torchpace.profile.capture import CaptureOptions, capture_profile
from torchpace.profile.result import ProfileResult, build_profile_result
from torchpace.profile.trace import parse_trace
from torchpace.profile.effect import settings_in_effect
from torchpace.profile.verdict import applicable_knobs_by_stage, build_offer, candidate_values
from torchpace.workload import DEFAULT_WORKLOAD, load_workload


def profile_workload(spec: str | None, config: RunConfig | None = None, options: CaptureOptions = CaptureOptions(), *,
                     host: HostFacts | None = None, device: str | None = None,
                     trace_path: str | Path | None = None) -> ProfileResult:
    """Load workload `spec`, run it under the profiler, and return the findings and verdict.

    Raises:
        UsageError: the spec or config is not valid here.
        UserCodeError: the workload's own code raised (while building or stepping).
    """
    start = time.perf_counter()
    host = host or probe_host()
    check_device(device, host)
    workload = load_workload(spec)
    fix_glibc_thresholds()  # the malloc a trial process and a launch run with
    with measure_other_load() as load:
        capture = capture_profile(workload, config, options, host=host, device=device)
    written, failure = save_trace_keeping_figures(capture.document, trace_path)
    trace = parse_trace(capture.document)
    result = build_profile_result(
        trace,
        workload_spec=spec or DEFAULT_WORKLOAD,
        knobs_by_stage=applicable_knobs_by_stage(host, workload),
        offer=build_offer(host, workload, candidates=candidate_values(host, workload), in_effect=settings_in_effect(trace)),
        trace_path=written,
        wall_time_s=time.perf_counter() - start,
        other_load_cores=load.cores,
        usable_cores=host.usable_cores,
    )
    if failure is not None:  # the figures go with the error: the CLI prints them, then the one line
        failure.figures = result
        raise failure
    return result


def save_trace_keeping_figures(document, trace_path: str | Path | None):
    """(the trace's path once written, or None; the `OutputWriteFailed` when it could not be written).
    A trace that cannot be written (a full disk) must not lose the profile's figures."""
    from torchpace.profile.capture import save_trace

    if trace_path is None:
        return None, None
    try:
        return str(save_trace(document, trace_path)), None
    except OutputWriteFailed as failure:
        return None, failure


def check_device(device: str | None, host: HostFacts) -> None:
    """UsageError when `device` asks for CUDA on a host without a CUDA device."""
    if device and device.startswith("cuda") and not host.cuda_available:
        raise UsageError(f"--device {device!r}: no CUDA device on this host; use --device cpu or leave it unset")
