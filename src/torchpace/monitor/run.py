"""Run CMD under the monitor: start it, sample it from a background thread, forward signals, clean up.

Lifecycle of `run_monitor`:

1. Check the options, find CMD (exit 127 when it does not exist, 126 when it cannot run), open NVML
   and the sinks (exit 2 for an unwritable ``--csv``) — all before anything is started.
2. Start CMD in a new session, so it leads its own process group, and start the `SamplerThread`.
3. Loop in the main thread: hand each sample to the symptom tracker, the view and the sinks; pass
   CMD's terminal output to the live view; forward SIGINT, SIGTERM and SIGHUP to CMD's process
   group (and SIGKILL its tree after a second one, or if it is still running `stop_grace_s` after the first).
4. When CMD exits, stop the sampler, stop whatever CMD left running (its process group and every
   process ever seen in its tree: SIGTERM, then SIGKILL after `leftover_grace_s`), close the sinks.
Starting, forwarding and stopping are `torchpace.process`'s.

The sampler thread's own CPU time is measured with `time.thread_time()` inside the thread; the
result reports it next to the thread's wall time, so the cost of sampling is a number, not a claim.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil

from torchpace.errors import TorchpaceError, UsageError
from torchpace.findings import Finding, Remedy, Severity
from torchpace.files import describe_write_error
from torchpace.host import probe_usable_cores
from torchpace.monitor import MAX_INTERVAL_S, MIN_INTERVAL_S
from torchpace.monitor.live import View
from torchpace.monitor.samplers import Clock, GpuSampler, HostSampler, Sampler
from torchpace.monitor.samples import MetricsAccumulator, MetricStats, Sample, build_column_names, flatten_sample
from torchpace.monitor.sinks import Sink, open_sinks
from torchpace.monitor.symptoms import SymptomContext, SymptomTracker
from torchpace.process import SignalForwarder, exit_code, start_child, stop_tree

_log = logging.getLogger(__name__)

EXIT_NOT_FOUND = 127  # as POSIX shells: the command was not found
EXIT_NOT_EXECUTABLE = 126  # as POSIX shells: found, but it cannot be executed

_STOP_GRACE_S = 30.0  # as torchrun's worker shutdown: time for CMD to save a checkpoint before SIGKILL
_LEFTOVER_GRACE_S = 3.0  # processes CMD left behind get this long after SIGTERM before SIGKILL
_POLL_S = 0.1  # how often the main loop checks whether CMD exited: exit is noticed within 0.1 s
_MAX_PENDING_OUTPUT = 65536  # a "line" longer than this without a newline is shown as it is
_OUTPUT_BATCH_S = 0.05  # CMD's output is passed to the view at most every 50 ms: bounded redraws, no visible lag


class CommandNotFoundError(TorchpaceError):
    """CMD names no file and nothing on PATH. Exit 127, as a shell would."""

    exit_code = EXIT_NOT_FOUND


class CommandNotExecutableError(TorchpaceError):
    """CMD exists but cannot be executed (a directory, no execute permission). Exit 126."""

    exit_code = EXIT_NOT_EXECUTABLE


@dataclass(frozen=True)
class MonitorOptions:
    """What to run and how to watch it.

    Attributes:
        command: CMD and its arguments.
        interval_s: seconds between samples (`MIN_INTERVAL_S` to `MAX_INTERVAL_S`).
        csv_path: write one CSV row per sample here.
        tensorboard_dir: write TensorBoard scalars here (needs ``torchpace[tensorboard]``).
        capture_output: pass CMD's (stdout, stderr) through the view, for the live view on a terminal;
            False leaves CMD's streams untouched.
        stop_grace_s: after a forwarded signal, seconds before CMD's process tree gets SIGKILL.
        leftover_grace_s: after CMD exits, seconds its leftover processes get between SIGTERM and SIGKILL.
    """

    command: tuple[str, ...]
    interval_s: float = 1.0
    csv_path: Path | None = None
    tensorboard_dir: Path | None = None
    capture_output: tuple[bool, bool] = (False, False)
    stop_grace_s: float = _STOP_GRACE_S
    leftover_grace_s: float = _LEFTOVER_GRACE_S


@dataclass(frozen=True)
class MonitorResult:
    """What a monitored run did. Times are seconds; `*_at_s` are seconds since CMD started."""

    command: tuple[str, ...]
    exit_code: int
    started_unix_s: float
    wall_s: float
    interval_s: float
    usable_cores: int
    sample_count: int
    metrics: tuple[MetricStats, ...]
    alerts: tuple[Finding, ...]
    notes: tuple[Finding, ...]
    sampler_cpu_s: float
    sampler_wall_s: float
    process_cpu_s: float
    signals_forwarded: tuple[str, ...]
    leftovers_stopped: int
    csv_path: Path | None = None
    tensorboard_dir: Path | None = None


# --------------------------------------------------------------------------- pure decisions


def check_options(options: MonitorOptions) -> None:
    """Raise UsageError for options no run could honour."""
    if not options.command:
        raise UsageError("no CMD given: write it after `--`, e.g. `torchpace monitor -- python train.py`")
    if not (math.isfinite(options.interval_s) and MIN_INTERVAL_S <= options.interval_s <= MAX_INTERVAL_S):
        raise UsageError(f"--interval must be a number of seconds from {MIN_INTERVAL_S} to {MAX_INTERVAL_S:g}, "
                         f"got {options.interval_s}")


def build_child_env(environ: Mapping[str, str], capture_output: tuple[bool, bool]) -> dict[str, str]:
    """CMD's environment: ours, plus PYTHONUNBUFFERED=1 when its output is piped to the live view
    (so Python's print() shows up line by line, not in 8 KiB blocks) unless the user set it."""
    env = dict(environ)
    if any(capture_output):
        env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def split_output(buffer: bytes) -> tuple[list[tuple[str, bool]], bytes]:
    """Split CMD's output into ``(text, partial)`` pieces and the unfinished rest.

    A piece ended by ``\\n`` is a line; one ended by ``\\r`` alone is a progress-bar redraw
    (``partial``). A trailing ``\\r`` waits for the next chunk, as it may be half of ``\\r\\n``.
    """
    pieces: list[tuple[str, bool]] = []
    start = 0
    for i, byte in enumerate(buffer):
        if byte == 0x0A:
            pieces.append((buffer[start:i].rstrip(b"\r").decode("utf-8", "replace"), False))
            start = i + 1
        elif byte == 0x0D and i + 1 < len(buffer) and buffer[i + 1] != 0x0A:
            pieces.append((buffer[start:i].decode("utf-8", "replace"), True))
            start = i + 1
    rest = buffer[start:]
    if len(rest) > _MAX_PENDING_OUTPUT:
        pieces.append((rest.decode("utf-8", "replace"), True))
        rest = b""
    return pieces, rest


def build_summary(result: MonitorResult) -> dict[str, Any]:
    """The run as JSON-able data: what ``--json`` prints and the summary table shows."""
    return {
        "command": list(result.command),
        "exit_code": result.exit_code,
        "started_unix_s": result.started_unix_s,
        "wall_s": result.wall_s,
        "interval_s": result.interval_s,
        "usable_cores": result.usable_cores,
        "samples": result.sample_count,
        "metrics": [{"name": m.name, "unit": m.unit, "mean": m.mean, "p95": m.p95, "max": m.max}
                    for m in result.metrics],
        "alerts": [a.to_dict() for a in result.alerts],
        "notes": [n.to_dict() for n in result.notes],
        "sampler": {
            "cpu_s": result.sampler_cpu_s,
            "wall_s": result.sampler_wall_s,
            "core_pct": 100.0 * result.sampler_cpu_s / result.sampler_wall_s if result.sampler_wall_s > 0 else 0.0,
        },
        "monitor_process_cpu_s": result.process_cpu_s,
        "signals_forwarded": list(result.signals_forwarded),
        "leftover_processes_stopped": result.leftovers_stopped,
        "csv": str(result.csv_path) if result.csv_path else None,
        "tensorboard": str(result.tensorboard_dir) if result.tensorboard_dir else None,
    }


# --------------------------------------------------------------------------- effects: finding and starting CMD


def resolve_command(command: Sequence[str], path: str | None = None) -> str:
    """The executable CMD names, looked up as a shell would.

    Raises:
        CommandNotFoundError: nothing by that name (exit 127).
        CommandNotExecutableError: it exists but cannot be run (exit 126).
    """
    name = command[0]
    if "/" not in name:
        found = shutil.which(name, path=path)
        if found is None:
            raise CommandNotFoundError(f"command not found: {name!r} is not on PATH; check the spelling or give its path")
        return found
    if not os.path.exists(name):
        raise CommandNotFoundError(f"command not found: {name!r} does not exist")
    if os.path.isdir(name) or not os.access(name, os.X_OK):
        raise CommandNotExecutableError(f"cannot execute {name!r}: it is a directory or not executable (chmod +x?)")
    return name


def start_command(options: MonitorOptions) -> subprocess.Popen:
    """Start CMD in a new session (its own process group, detached from our terminal's signals); it
    gets SIGTERM should torchpace die without forwarding anything (kill -9)."""
    out, err = options.capture_output
    try:
        return start_child(
            options.command,
            death_signal=signal.SIGTERM,
            env=build_child_env(os.environ, options.capture_output),
            stdout=subprocess.PIPE if out else None,
            stderr=subprocess.PIPE if err else None,
        )
    except FileNotFoundError as exc:
        raise CommandNotFoundError(f"command not found: {options.command[0]!r}") from exc
    except OSError as exc:
        raise CommandNotExecutableError(f"cannot execute {options.command[0]!r}: {exc.strerror or exc}") from exc


# --------------------------------------------------------------------------- the sampler thread


class SamplerThread(threading.Thread):
    """Takes a sample every `interval_s` seconds and puts it on `out`, until `stop()`.

    Samples are due at fixed times (start + k * interval), so they do not drift; when a sample is late
    (the machine is overloaded) the schedule restarts from now rather than bursting. `cpu_s` is this
    thread's own CPU time (`time.thread_time()`), `wall_s` its lifetime: their ratio is the cost of
    sampling. An error while sampling stops sampling, not CMD; it is kept in `error`.
    """

    def __init__(self, sampler: Sampler, interval_s: float, out: queue.SimpleQueue, clock: Clock = time.monotonic):
        super().__init__(name="torchpace-monitor-sampler", daemon=True)
        self._sampler = sampler
        self._interval_s = interval_s
        self._out = out
        self._clock = clock
        self._stop_event = threading.Event()
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        cpu0, wall0 = time.thread_time(), self._clock()
        try:
            self._loop(wall0)
        except Exception as err:  # any failure of sampling must leave CMD running; reported in the summary
            self.error = err
        finally:
            self.cpu_s = time.thread_time() - cpu0
            self.wall_s = self._clock() - wall0

    def _loop(self, due: float) -> None:
        while True:
            sample = self._sampler.take()
            if sample is not None:
                self._out.put(sample)
            due += self._interval_s
            delay = due - self._clock()
            if delay < 0:
                due, delay = self._clock(), 0.0
            if self._stop_event.wait(delay):
                return

    def stop(self) -> None:
        """Ask the thread to finish and wait until it has."""
        self._stop_event.set()
        self.join()


# --------------------------------------------------------------------------- CMD's output in live mode


class OutputPump:
    """Reads CMD's piped stdout/stderr without blocking and hands it to the view in batches.

    Once output arrives, more is collected for up to `_OUTPUT_BATCH_S` before the view gets it, so a
    CMD printing thousands of lines a second costs at most ~20 view updates a second.
    """

    def __init__(self, pipes: Sequence[Any], view: View):
        self._selector = selectors.DefaultSelector()
        self._pending: dict[int, bytes] = {}
        self._view = view
        self._lines: list[str] = []
        self._progress: str | None = None
        for pipe in pipes:
            if pipe is not None:
                self._selector.register(pipe.fileno(), selectors.EVENT_READ)
                self._pending[pipe.fileno()] = b""

    @property
    def active(self) -> bool:
        return bool(self._pending)

    def pump(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for output; then collect for one batch and pass it on."""
        ready = self._selector.select(timeout_s)
        deadline = time.monotonic() + _OUTPUT_BATCH_S
        while ready:
            for key, _ in ready:
                self._read(key.fd)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.active:
                break
            ready = self._selector.select(remaining)
        self._flush()

    def drain(self, timeout_s: float) -> None:
        """Read until every pipe reached end-of-file or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while self.active and time.monotonic() < deadline:
            self.pump(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self._selector.close()

    def _read(self, fd: int) -> None:
        data = os.read(fd, 65536)
        if not data:
            rest = self._pending.pop(fd).rstrip(b"\r")
            self._selector.unregister(fd)
            if rest:
                self._lines.append(rest.decode("utf-8", "replace"))
            return
        pieces, self._pending[fd] = split_output(self._pending[fd] + data)
        for text, partial in pieces:
            if partial:
                self._progress = text
            else:
                self._lines.append(text)

    def _flush(self) -> None:
        if self._lines or self._progress is not None:
            self._view.on_output(self._lines, self._progress)
        self._lines, self._progress = [], None


# --------------------------------------------------------------------------- the run


class _Supervisor:
    """The main loop's state: everything a sample, an alert or CMD's output goes to."""

    def __init__(self, view: View, sinks: list[Sink], tracker: SymptomTracker, started_unix_s: float):
        self.view = view
        self.sinks = sinks
        self.tracker = tracker
        self.started_unix_s = started_unix_s
        self.samples: queue.SimpleQueue = queue.SimpleQueue()
        self.metrics = MetricsAccumulator()
        self.sample_count = 0
        self.notes: list[Finding] = []

    def wait(self, pump: OutputPump, timeout_s: float) -> None:
        """Block up to `timeout_s` for CMD's output or a sample, then handle every sample queued."""
        if pump.active:
            pump.pump(timeout_s)
        else:
            with contextlib.suppress(queue.Empty):
                self.handle(self.samples.get(timeout=timeout_s))
        self.drain()

    def drain(self) -> None:
        while True:
            try:
                sample = self.samples.get_nowait()
            except queue.Empty:
                return
            self.handle(sample)

    def handle(self, sample: Sample) -> None:
        self.sample_count += 1
        for event in self.tracker.update(sample):
            self.view.on_alert(event)
        self.view.on_sample(sample)
        row = flatten_sample(sample, self.started_unix_s)
        self.metrics.add(row)
        for sink in list(self.sinks):
            self._write(sink, row)

    def _write(self, sink: Sink, row: dict) -> None:
        try:
            sink.write(row)
        except OSError as err:  # a full disk ends the log, never CMD: said in the summary, with the free space
            self.sinks.remove(sink)
            with contextlib.suppress(OSError):  # what it still buffers cannot be written either
                sink.close()
            evidence = describe_write_error(_sink_path(sink), err)
            self.notes.append(Finding("monitor.sink_failed", Severity.WARN, "A log stopped being written",
                                      evidence=f"{type(sink).__name__}: {evidence}", area="monitor"))


def probe_cores() -> int:
    """Cores this process (and so CMD, which inherits it) may use: affinity capped by the cgroup quota."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return probe_usable_cores(Path("/"), os.cpu_count() or 1, affinity)


def _sampler_note(error: BaseException) -> Finding:
    return Finding("monitor.sampler_failed", Severity.WARN, "Sampling stopped early; CMD ran on",
                   evidence=f"{type(error).__name__}: {error}", area="monitor",
                   remedy=Remedy("Please report this with the evidence at the torchpace issue tracker."))


def run_monitor(options: MonitorOptions, view: View, clock: Clock = time.monotonic, nvml: Any = None,
                usable_cores: int | None = None) -> MonitorResult:
    """Run CMD to completion under the monitor and return what happened (see the module docstring).

    Args:
        options: what to run and how.
        view: where samples, alerts and CMD's captured output are shown (`LiveView`, `PlainView`).
        clock: monotonic seconds; injectable for tests.
        nvml: NVML bindings (None imports pynvml); injectable for tests.
        usable_cores: cores CMD may use, for the symptom rules; None probes affinity and cgroup quota.

    Raises:
        UsageError: bad options, an unwritable --csv, TensorBoard missing (exit 2); nothing was started.
        OutputWriteFailed: --csv or --tensorboard on a full disk (exit 1); nothing was started.
        CommandNotFoundError, CommandNotExecutableError: exit 127 / 126; nothing was started.
    """
    check_options(options)
    resolve_command(options.command)
    gpu, gpu_note = GpuSampler.open(nvml)
    try:
        columns = build_column_names(psutil.cpu_count() or 1, gpu.count if gpu else 0)
        sinks = open_sinks(options.csv_path, options.tensorboard_dir, columns)
    except BaseException:
        if gpu is not None:
            gpu.close()
        raise
    try:
        return _run_started(options, view, clock, gpu, sinks, [gpu_note] if gpu_note else [],
                            usable_cores or probe_cores())
    finally:
        for sink in sinks:
            try:
                sink.close()
            except OSError as err:  # its last lines met a full disk: CMD's run is over, its exit status stands
                _log.warning("%s: %s", type(sink).__name__, describe_write_error(_sink_path(sink), err))
        if gpu is not None:
            gpu.close()


def _sink_path(sink: Sink) -> Path:
    return Path(getattr(sink, "path", None) or getattr(sink, "log_dir", None) or ".")


def _run_started(options: MonitorOptions, view: View, clock: Clock, gpu: GpuSampler | None,
                 sinks: list[Sink], notes: list[Finding], usable_cores: int) -> MonitorResult:
    """Start CMD and the sampler, supervise until CMD exits, clean up (sinks are closed by the caller)."""
    supervisor = _Supervisor(view, sinks, SymptomTracker(SymptomContext(usable_cores)), time.time())
    cpu0, t0 = time.process_time(), clock()
    forwarder = SignalForwarder(None, options.stop_grace_s, clock)
    thread: SamplerThread | None = None
    host: HostSampler | None = None
    with forwarder.installed():  # from before CMD starts, and during clean-up: a second Ctrl-C must not abort it
        proc = start_command(options)
        forwarder.attach(proc.pid)
        pump = OutputPump([proc.stdout, proc.stderr], view)
        try:
            host = HostSampler(proc.pid, clock=clock)
            thread = SamplerThread(Sampler(host, gpu, t0), options.interval_s, supervisor.samples, clock)
            thread.start()
            view.start()
            ended_s = _supervise(proc, supervisor, pump, forwarder, clock)
        finally:
            if thread is not None and thread.is_alive():
                thread.stop()
            known = host.known_processes() if host is not None else []
            leftovers = stop_tree(proc, options.leftover_grace_s, known)  # CMD too, when torchpace itself failed
            pump.drain(options.leftover_grace_s)
            pump.close()
            supervisor.drain()
            view.stop()
    _log.info("command (pid %d) ended with exit status %s after %.1f s; %d leftover processes stopped",
              proc.pid, proc.returncode, ended_s - t0, leftovers)
    if thread.error is not None:
        notes.append(_sampler_note(thread.error))
    return MonitorResult(
        command=tuple(options.command), exit_code=exit_code(proc.returncode),
        started_unix_s=supervisor.started_unix_s, wall_s=ended_s - t0, interval_s=options.interval_s,
        usable_cores=usable_cores, sample_count=supervisor.sample_count,
        metrics=tuple(supervisor.metrics.stats()), alerts=tuple(supervisor.tracker.alerts()),
        notes=tuple(notes + supervisor.notes), sampler_cpu_s=thread.cpu_s, sampler_wall_s=thread.wall_s,
        process_cpu_s=time.process_time() - cpu0, signals_forwarded=tuple(forwarder.received),
        leftovers_stopped=leftovers, csv_path=options.csv_path, tensorboard_dir=options.tensorboard_dir,
    )


def _supervise(proc: subprocess.Popen, supervisor: _Supervisor, pump: OutputPump, forwarder: SignalForwarder,
               clock: Clock) -> float:
    """The main loop: until CMD exits, handle samples and output, escalate an ignored stop signal.

    Returns:
        the clock time CMD was seen to have exited.
    """
    while proc.poll() is None:
        supervisor.wait(pump, _POLL_S)
        forwarder.escalate_if_due()
    return clock()
