"""What a bench measured, as frozen records (no torch: the tuner, the report and the trial protocol read them).

`BenchResult` nests one record per part of the measurement: `step` (what one optimizer step is:
samples per process, micro-batches, processes), `throughput` (the real step's windows: samples/s,
or steps/s when the samples per step are unknown, and steps/s always), `latency` (inference: batch-1
calls), `script` (script mode: how steps and samples were counted, what the hook changed) and
`accuracy` (inference: outputs against the fp32 eager reference). Its `objective` says which figure
it is judged by, in which unit, with its CI: no reader has to guess from which field is null.

The JSON (`torchpace bench --json`, a trial's RESULT.json) keeps the flat field names it has always
had (`samples_per_s`, `latency_p50_s`, ...) plus `objective`; `BenchResult.from_dict` reads every
version written so far (one before steps/s and script mode, one of script mode with `samples_per_s`
null, the current one). The schema (`torchpace.measure.schema`) is derived from these records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from torchpace.measure.stats import summarize
from torchpace.records import from_json, spec, to_json

RESULT_KIND = "torchpace.bench"
RESULT_SCHEMA_VERSION = 1

THROUGHPUT, LATENCY = "throughput", "latency"  # the objectives a result is judged by
SAMPLES_PER_S, STEPS_PER_S, SECONDS = "samples/s", "steps/s", "s"  # their units
UNITS = (SAMPLES_PER_S, STEPS_PER_S, SECONDS)


@dataclass(frozen=True)
class Objective:
    """The one figure a result is judged by: which, in what unit, its value and the 95% CI of it.

    Attributes:
        name: `throughput` (higher is better) or `latency` (batch-1 p50; lower is better).
        unit: `samples/s`, `steps/s` (a script whose samples per step are unknown) or `s`.
        value: the median (of the windows, the calls, or of pooled or paired measurements).
        ci_low: the 95% CI of that median (None when unknown).
        ci_high: see `ci_low`.
        ci_rel_halfwidth: half the CI's width relative to the value (0.02: ±2%).
    """

    name: str = field(metadata=spec(enum=[THROUGHPUT, LATENCY]))
    unit: str = field(metadata=spec(enum=list(UNITS)))
    value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_rel_halfwidth: float | None = None

    @property
    def higher_is_better(self) -> bool:
        return self.name != LATENCY

    @property
    def score(self) -> float | None:
        """The figure as "higher is better" (1 / value for latency): what the tuner maximises."""
        if self.value is None or (not self.higher_is_better and self.value <= 0):
            return None
        return self.value if self.higher_is_better else 1.0 / self.value

    @property
    def unit_noun(self) -> str:
        """`samples`, `steps` or `s`: the unit without "/s", for labels such as "steps/s [95% CI]"."""
        return self.unit.removesuffix("/s")


@dataclass(frozen=True)
class StepShape:
    """What one optimizer step is.

    Attributes:
        batch_size: per process (script mode: samples of one optimizer step; null when unknown).
        grad_accumulation: micro-batches (script mode: `backward()` calls) per step.
        world_size: processes training together (torchrun).
        global_batch_size: samples of one optimizer step over all processes: batch_size * world_size.
    """

    batch_size: int | None = field(metadata=spec(minimum=1))
    grad_accumulation: int = field(default=1, metadata=spec(minimum=1))
    world_size: int = field(default=1, metadata=spec(minimum=1))
    global_batch_size: int | None = field(default=None, metadata=spec(minimum=1))


_SAMPLES_UNKNOWN = "null when the samples per step are unknown (script mode)"


@dataclass(frozen=True)
class ThroughputFigures:
    """The real step's measured windows (`torchpace.measure.bench.throughput_figures` defines them).

    Attributes:
        ci_rel_halfwidth: half the 95% CI's width relative to the median of the measured figure
            (samples/s, else steps/s).
        noise_warning: IQR / median above 10%.
        step_time_s: seconds per step: 1 / `steps_per_s`, the windows' median (one median for both figures).
        windows: measured windows.
        measured_steps: steps in the measured windows.
        window_samples_per_s: each window's samples/s (empty when the samples per step are unknown).
        warmup_s: seconds of warm-up (excluded from the figures).
        warmup_converged: two consecutive warm-up windows agreed before measuring.
        steps_per_s: optimizer steps per second: median of the windows (null in results written before
            it was measured).
        window_steps_per_s: each window's steps/s.
    """

    samples_per_s: float | None = field(metadata=spec(_SAMPLES_UNKNOWN))
    samples_per_s_ci_low: float | None = field(metadata=spec(_SAMPLES_UNKNOWN))
    samples_per_s_ci_high: float | None = field(metadata=spec(_SAMPLES_UNKNOWN))
    samples_per_s_iqr: float | None = field(metadata=spec(_SAMPLES_UNKNOWN))
    ci_rel_halfwidth: float
    noise_warning: bool
    step_time_s: float
    windows: int = field(metadata=spec(minimum=1))
    measured_steps: int = field(metadata=spec(minimum=1))
    window_samples_per_s: tuple[float, ...]
    warmup_s: float
    warmup_steps: int
    warmup_converged: bool
    stopped_by: str = field(metadata=spec(
        "ci: the CI target was met; time: the time cap (also when a script made no step past it); script-ended: the "
        "script finished before either; script-stalled: the script stopped stepping (no step for 30 s and 5x its "
        "longest step, time spent compiling left out), its windows so far; "
        "pair: one arm of a paired comparison (`torchpace compare`, tune), ended by the comparison",
        enum=["ci", "time", "script-ended", "script-stalled", "pair"]))
    steps_per_s: float | None = None
    steps_per_s_ci_low: float | None = None
    steps_per_s_ci_high: float | None = None
    window_steps_per_s: tuple[float, ...] = ()

    @property
    def samples_known(self) -> bool:
        return self.samples_per_s is not None

    @property
    def unit(self) -> str:
        """`samples/s`, or `steps/s` when the samples per step are unknown."""
        return SAMPLES_PER_S if self.samples_known else STEPS_PER_S

    @property
    def rate(self) -> Objective:
        """The measured figure in its unit, with its CI (the throughput objective)."""
        if self.samples_known:
            return Objective(THROUGHPUT, SAMPLES_PER_S, self.samples_per_s, self.samples_per_s_ci_low,
                             self.samples_per_s_ci_high, self.ci_rel_halfwidth)
        return Objective(THROUGHPUT, STEPS_PER_S, self.steps_per_s, self.steps_per_s_ci_low, self.steps_per_s_ci_high,
                         self.ci_rel_halfwidth)

    @property
    def window_rates(self) -> tuple[float, ...]:
        """Each window's figure in `unit`."""
        return self.window_samples_per_s if self.samples_known else self.window_steps_per_s

    @property
    def iqr_frac(self) -> float | None:
        """IQR / median of samples/s (None when the samples per step are unknown)."""
        if not self.samples_per_s or self.samples_per_s_iqr is None:
            return None
        return self.samples_per_s_iqr / self.samples_per_s


@dataclass(frozen=True)
class LatencyFigures:
    """Per-call latency of one request (inference workloads), in seconds; JSON names `latency_*`.

    Attributes:
        batch_size: samples per call (1).
        p50_s: the median call's seconds.
        p50_ci_low_s: the 95% CI of p50 (low end).
        p50_ci_high_s: the 95% CI of p50 (high end).
        ci_rel_halfwidth: half the p50 CI's width relative to p50.
        calls: timed calls.
        warmup_s: seconds of warm-up calls (excluded).
        stopped_by: `ci` (target met), `time` (deadline), `calls` (the most calls) or `pair` (the calls of a
            paired comparison's turns, which its parent ended).
    """

    batch_size: int = field(metadata=spec(minimum=1))
    p50_s: float
    p90_s: float
    p99_s: float
    p50_ci_low_s: float
    p50_ci_high_s: float
    ci_rel_halfwidth: float
    calls: int = field(metadata=spec(minimum=1))
    warmup_s: float
    stopped_by: str = field(metadata=spec(enum=["ci", "time", "calls", "pair"]))

    @property
    def objective(self) -> Objective:
        return Objective(LATENCY, SECONDS, self.p50_s, self.p50_ci_low_s, self.p50_ci_high_s, self.ci_rel_halfwidth)


@dataclass(frozen=True)
class AccuracyReport:
    """A candidate's outputs against the fp32 eager reference, and the verdict (`torchpace.inference.accuracy`).

    Attributes:
        samples: outputs compared.
        max_abs_err: the largest |candidate - reference| of any output element.
        max_rel_err: `max_abs_err` over the largest |reference| element.
        top1_agreement: share of samples whose argmax matches (classifiers; null otherwise).
        ok: within the tolerances (`rtol` relative to `reference_max_abs`, `atol`, `min_top1_agreement`).
        reference_max_abs: the largest |reference| element.
    """

    samples: int = field(metadata=spec(minimum=0))
    max_abs_err: float
    max_rel_err: float
    top1_agreement: float | None = field(metadata=spec(minimum=0, maximum=1))
    ok: bool
    reason: str
    reference_max_abs: float | None = field(default=None, metadata=spec(required=False))
    rtol: float | None = field(default=None, metadata=spec(required=False))
    atol: float | None = field(default=None, metadata=spec(required=False))
    min_top1_agreement: float | None = field(default=None, metadata=spec(required=False))

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AccuracyReport":
        return from_json(cls, data)


@dataclass(frozen=True)
class ScriptOverride:
    """One argument of a script's DataLoader or optimizer that the config changed (`script.inprocess`)."""

    knob: str
    object: str
    where: str
    argument: str
    old: Any = None
    new: Any = None


@dataclass(frozen=True)
class CompileReport:
    """Script mode with `compile.mode`: what the hook compiled and what dynamo counted in the process.

    Attributes:
        mode: the torch.compile mode.
        modules: the class names of the modules compiled in place (after the script's first backward()).
        compiled_calls: forward calls that ran compiled code.
        graphs: the unique graphs dynamo compiled.
        graph_breaks: the graph breaks dynamo counted.
        break_reasons: the most frequent graph-break reasons, each with its count.
        compile_s: seconds from the first compiled call until the backward() after it returned (the
            compilation of forward and backward); null when it was not over.
        cache_hits: graphs inductor took from its cache (compiled by an earlier process: an earlier trial).
        cache_misses: graphs inductor compiled afresh.
        failure: why a module could not be compiled (the trial is then invalid); null when all compiled.
    """

    mode: str
    modules: tuple[str, ...] = ()
    compiled_calls: int = field(default=0, metadata=spec(minimum=0))
    graphs: int = field(default=0, metadata=spec(minimum=0))
    graph_breaks: int = field(default=0, metadata=spec(minimum=0))
    break_reasons: Mapping[str, int] = field(default_factory=dict)
    compile_s: float | None = field(default=None, metadata=spec(required=False, minimum=0))
    cache_hits: int = field(default=0, metadata=spec(minimum=0))
    cache_misses: int = field(default=0, metadata=spec(minimum=0))
    failure: str | None = None


@dataclass(frozen=True)
class ScriptInfo:
    """Script mode: the command, how steps and samples were counted, and what the launch hook changed.

    Attributes:
        steps_seen: steps the script made while measured.
        ended_early: the script ended before the measurement did.
        reached: knobs that took effect in the script.
        not_applied: knob -> why it could not take effect where it was met.
        output_log: the log file that holds the script's own output (stdout and stderr).
        compile: with `compile.mode`: what was compiled, its graphs and graph breaks.
        script_settings: the script's own values of the knobs that reach it, as it passed them before any knob
            changed them (the first DataLoader it read from, the first optimizer that stepped): what its baseline
            runs with (None in results written before they were read).
        more: what else the hook reported, kept as it was written.
    """

    command: tuple[str, ...] = ()
    step_source: str | None = field(default=None, metadata=spec(enum=["optimizer", "backward"]))
    samples_source: str | None = field(default=None, metadata=spec(enum=["dataloader", "--samples-per-step", None]))
    steps_seen: int | None = field(default=None, metadata=spec(required=False))
    ended_early: bool = False
    overrides: tuple[ScriptOverride, ...] = ()
    reached: tuple[str, ...] = ()
    not_applied: Mapping[str, str] = field(default_factory=dict)
    output_log: str | None = field(default=None, metadata=spec(required=False))
    compile: CompileReport | None = field(default=None, metadata=spec(required=False))
    script_settings: Mapping[str, Any] | None = field(default=None, metadata=spec(required=False))
    more: Mapping[str, Any] = field(default_factory=dict, metadata=spec(rest=True))


@dataclass(frozen=True)
class RankFigures:
    """One rank of a job of several processes over the measured windows, by its own clock (its time from leaving
    one window's agreement to reaching the next: the time it waited there for slower ranks left out).

    Attributes:
        rank: its global rank.
        local_rank: its rank on its host.
        host: the host it ran on.
        pid: its process id.
        steps_per_s: the median of its windows' steps per second of its own time.
        samples_per_s: the median of its windows' samples per second of its own time (null when unknown).
        input_wait_frac: its share of its own time spent inside DataLoader `__next__`.
        backward_frac: its share of its own time spent inside `backward()`, where DistributedDataParallel's
            all-reduce waits for the slowest rank (on a CPU; a GPU's wait is on the device, not in this figure).
        peak_memory_bytes: its peak memory (the CUDA allocator's peak on a GPU, peak RSS on a CPU).
        mean_loss: the mean of its measured steps' losses (null when its steps had no loss tensor).
    """

    rank: int = field(metadata=spec(minimum=0))
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    input_wait_frac: float | None = field(default=None, metadata=spec(minimum=0, maximum=1))
    peak_memory_bytes: int | None = field(default=None, metadata=spec(minimum=0))
    mean_loss: float | None = None
    backward_frac: float | None = field(default=None, metadata=spec(minimum=0, maximum=1))

    @property
    def step_s(self) -> float | None:
        """Its own seconds per step."""
        return 1 / self.steps_per_s if self.steps_per_s else None

    @property
    def busy_s(self) -> float | None:
        """Its own seconds per step outside `backward()`: its work, where the others' wait for it is inside theirs."""
        step = self.step_s
        return None if step is None else step * (1 - (self.backward_frac or 0.0))


# A rank is a straggler when its own steps are this much slower than the other ranks' median (ranks that do not
# wait for each other at every step), or when it spends this share of a step more than they do outside
# backward(): in a synchronous job the others wait for it inside theirs, in the all-reduce
STRAGGLER_SLOWER = 0.10


@dataclass(frozen=True)
class Straggler:
    """A rank the others wait for (`find_straggler`).

    Attributes:
        rank: the rank.
        why: in words, with the figures that say it.
        slower_frac: how much longer its own work per step is than the other ranks' median, as a share of the
            job's step (0.2: 20%).
        input_wait_frac: its share of time waiting on its DataLoader.
    """

    rank: int
    why: str
    slower_frac: float | None = None
    input_wait_frac: float | None = None


def find_straggler(ranks: Sequence[RankFigures]) -> Straggler | None:
    """The rank that holds the job back, when one does materially (see `STRAGGLER_SLOWER`), the slowest such rank;
    None with fewer than two ranks, or when no rank stands out. Its own steps slower than the others' (they do not
    wait for it), or, in a job whose ranks meet at every step, more of its step spent outside backward() than the
    others spend: they wait for it in backward()'s all-reduce. Said with its input wait when that is most of it."""
    found: list[tuple[float, Straggler]] = []
    steps = [r.step_s for r in ranks if r.step_s]
    if len(steps) < 2:
        return None
    job_step_s = _median(steps)
    for figures in ranks:
        others = [r for r in ranks if r.rank != figures.rank]
        rates = [r.steps_per_s for r in others if r.steps_per_s]
        if figures.steps_per_s and rates and 1 - figures.steps_per_s / _median(rates) >= STRAGGLER_SLOWER:
            slower = 1 - figures.steps_per_s / _median(rates)
            found.append((slower, Straggler(figures.rank, (
                f"rank {figures.rank}'s own steps are {slower:.0%} slower than the other ranks' median "
                f"({figures.steps_per_s:.3g} vs {_median(rates):.3g} steps/s)"), slower, figures.input_wait_frac)))
            continue
        busy = [r.busy_s for r in others if r.busy_s is not None]
        if figures.busy_s is None or not busy:
            continue
        extra_s = figures.busy_s - _median(busy)
        if extra_s < STRAGGLER_SLOWER * job_step_s:
            continue
        share = extra_s / job_step_s
        waits = [r.input_wait_frac * r.step_s for r in others if r.input_wait_frac is not None and r.step_s]
        own_wait_s = (figures.input_wait_frac or 0.0) * (figures.step_s or 0.0)
        cause = (f"waiting on its DataLoader ({figures.input_wait_frac:.0%} of its time)"
                 if waits and own_wait_s - _median(waits) >= extra_s / 2 else "outside its DataLoader")
        found.append((share, Straggler(figures.rank, (
            f"rank {figures.rank} spends {extra_s * 1e3:.3g} ms more of each step than the other ranks outside "
            f"backward(), {cause}: {share:.0%} of the job's step; the others wait for it in backward()'s all-reduce"),
            share, figures.input_wait_frac)))
    return max(found, key=lambda item: item[0])[1] if found else None


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """Everything a bench measured (see the module docstring). JSON: `to_dict` / `from_dict`.

    Attributes:
        workload: the workload's name (script mode: the command).
        config: knobs that differ from their defaults, as the run had them (a workload's own DataLoader
            arguments, `Workload.loader_options`, included; script mode: every knob the config set, a value
            equal to the default too: it replaced the script's own argument).
        step: what one optimizer step is (per process and over all processes).
        throughput: the real step's windows.
        compute_only_samples_per_s: the same step on one batch pre-staged on the device (null in script mode).
        input_bound_frac: 1 - samples/s over the compute-only figure (script mode: the measured share of
            the windows spent in the DataLoader iterator's `__next__`); null when not measured.
        peak_memory_bytes: the CUDA allocator's peak on a GPU, the process's peak RSS on a CPU.
        loss_values: the loss of every step, warm-up included (empty for inference, and as stored on a trial).
        wall_time_s: the bench's wall time.
        host: the host's summary with its `fingerprint` (empty as stored on a trial).
        latency: inference workloads: batch-1 latency (None otherwise).
        model_size_bytes: the prepared model's weights as saved (state_dict, or the TorchScript archive).
        accuracy: outputs vs the fp32 eager reference on the first batches of the dataset.
        other_load_cores: cores processes outside torchpace's own tree kept busy while this was measured.
        script: script mode: the command, how steps and samples were counted, what the hook changed.
        ranks: a job of several processes measured from inside its script: each rank by its own clock.
        straggler: the rank the others waited for, when one did materially (`find_straggler` of `ranks`).
    """

    JSON_DERIVED = ("objective",)

    kind: str = field(default=RESULT_KIND, metadata=spec(const=RESULT_KIND))
    schema_version: int = field(default=RESULT_SCHEMA_VERSION, metadata=spec(const=RESULT_SCHEMA_VERSION))
    workload: str
    config: Mapping[str, Any]
    device: str
    step: StepShape = field(metadata=spec(inline=""))
    throughput: ThroughputFigures = field(metadata=spec(inline=""))
    compute_only_samples_per_s: float | None = None
    input_bound_frac: float | None = field(default=None, metadata=spec(minimum=0, maximum=1))
    peak_memory_bytes: int = field(metadata=spec(minimum=0))
    peak_memory_kind: str = field(metadata=spec(enum=["cuda_max_allocated", "cpu_peak_rss"]))
    loss_values: tuple[float, ...] = ()
    wall_time_s: float
    host: Mapping[str, Any] = field(default_factory=dict)
    latency: LatencyFigures | None = field(default=None, metadata=spec(inline="latency_"))
    model_size_bytes: int | None = field(default=None, metadata=spec(minimum=0))
    accuracy: AccuracyReport | None = None
    other_load_cores: float | None = field(default=None, metadata=spec(required=False, minimum=0))
    script: ScriptInfo | None = None
    ranks: tuple[RankFigures, ...] = ()
    straggler: Straggler | None = field(default=None, metadata=spec(required=False))

    @property
    def objective(self) -> Objective:
        """what this result is judged by: throughput in samples/s (steps/s when the samples per step are unknown)"""
        return self.throughput.rate

    def objective_for(self, name: str) -> Objective | None:
        """The figure of objective `name` (`throughput`, or `latency`: None when not measured)."""
        if name == LATENCY:
            return self.latency.objective if self.latency is not None else None
        return self.throughput.rate

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, partial: bool = False) -> "BenchResult":
        """A result from its JSON, of any version written so far (see the module docstring).

        Args:
            partial: `data` holds only some figures (a comparison's reference arm as stored by an
                older tuner): what it lacks is None.
        """
        return from_json(cls, data, partial=partial)


def pool_throughput(runs: Sequence[ThroughputFigures]) -> ThroughputFigures:
    """The figures of one config's separate runs taken together: every run's windows pooled, and the
    median of them with its 95% CI (`measure.stats.summarize`); the first run's when none has windows."""
    first = runs[0]
    steps = [w for r in runs for w in r.window_steps_per_s]
    samples = [w for r in runs for w in r.window_samples_per_s]
    pooled = samples if first.samples_known else steps
    if not pooled:
        return first
    summary = summarize(list(pooled))
    step_summary = summarize(steps) if steps else None
    sample_fields: dict[str, Any] = {}
    if first.samples_known:
        sample_fields = dict(samples_per_s=summary.median, samples_per_s_ci_low=summary.ci_low,
                             samples_per_s_ci_high=summary.ci_high, samples_per_s_iqr=summary.iqr,
                             window_samples_per_s=tuple(samples))
    return replace(first, **sample_fields, windows=summary.n, ci_rel_halfwidth=summary.ci_rel_halfwidth,
                   noise_warning=summary.noisy, measured_steps=sum(r.measured_steps for r in runs),
                   window_steps_per_s=tuple(steps), steps_per_s=step_summary.median if step_summary else first.steps_per_s,
                   step_time_s=1 / step_summary.median if step_summary else first.step_time_s,  # as `Throughput.step_time_s`
                   steps_per_s_ci_low=step_summary.ci_low if step_summary else first.steps_per_s_ci_low,
                   steps_per_s_ci_high=step_summary.ci_high if step_summary else first.steps_per_s_ci_high)

