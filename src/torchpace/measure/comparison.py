"""A comparison of two configs, as frozen records (`build_comparison` in `torchpace.compare.run` fills
them; `torchpace.compare.schema` is derived from them). JSON: `Comparison.to_dict`. They live beside the
bench's records so that every verb that shows a comparison (`compare`, `report`) reads the same ones."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchpace.measure.result import LATENCY, SAMPLES_PER_S, SECONDS, STEPS_PER_S, THROUGHPUT
from torchpace.records import from_json, spec, to_json

RESULT_KIND = "torchpace.compare"
RESULT_SCHEMA_VERSION = 1
VERDICTS = ("faster", "slower", "no difference", "too few rounds", "failed")


@dataclass(frozen=True)
class ComparisonArm:
    """One arm of a comparison: its config, how its trial ended, and the median of its rounds."""

    config: Mapping[str, Any] = field(metadata=spec(
        "knobs the arm's config set (a script's: a value equal to the default too, which replaced the script's own)"))
    status: str = field(metadata=spec("the arm's trial status (ok, crash, oom, timeout, nonfinite, invalid; partner: "
                                      "ended because the other arm failed, not judged)"))
    figure: float | None = field(metadata=spec("median of this arm's turns, in `unit` (latency: of the turns' p50s)"))
    ci_low: float | None
    ci_high: float | None
    rounds: int = field(metadata=spec("measured turns (alternating) or runs (sequential)", minimum=0))
    other_load_cores: float | None = field(metadata=spec("cores other processes used during this arm's turns"))
    error: str | None
    stderr_tail: str | None = field(default=None, metadata=spec(required=False))
    warmup_converged: bool | None = field(default=None, metadata=spec(required=False))
    label: str | None = field(default=None, metadata=spec(
        "what the arm ran, in words: its knobs, else the script's own settings (with them, as the script passed them) "
        "or PyTorch's defaults", required=False))
    turns: tuple[float, ...] = field(default=(), metadata=spec(
        "each turn's figure (separate runs': each run's) in `unit`, in the order measured; A's and B's alternate, "
        "A first, and every three make a round", required=False))

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Comparison:
    """B against A: the ratio B / A with its CI, each arm's figure, the verdict and the other load."""

    kind: str = field(metadata=spec(const=RESULT_KIND))
    schema_version: int = field(metadata=spec(const=RESULT_SCHEMA_VERSION))
    target: str = field(metadata=spec("the workload's name, or the script's label"))
    mode: str = field(metadata=spec("alternating: two processes held at once take turns; sequential: separate runs "
                                    "A B A B A B", enum=["alternating", "sequential"]))
    mode_reason: str | None = field(metadata=spec("why the comparison is sequential"))
    unit: str = field(metadata=spec("steps/s when a script's samples per step are unknown; s (batch-1 p50) under the "
                                    "latency objective", enum=[SAMPLES_PER_S, STEPS_PER_S, SECONDS]))
    stopped_by: str = field(metadata=spec("ci: the ratio's CI reached ±2%; time: --max-time; rounds: the separate runs' "
                                          "rounds were all run (mode sequential); ended: a script finished first; "
                                          "failed: an arm failed", enum=["ci", "time", "rounds", "ended", "failed"]))
    a: ComparisonArm
    b: ComparisonArm
    ratio: float | None = field(metadata=spec("B / A: the median of the per-round ratios (above 1: B is faster; under "
                                              "the latency objective a round's ratio is A's p50 over B's)"))
    ratio_ci_low: float | None = field(metadata=spec("95% CI of that median (binomial order statistics)"))
    ratio_ci_high: float | None
    ratio_ci_coverage: float | None = field(metadata=spec("the CI's coverage (below 0.95 with fewer than 6 rounds)"))
    rounds: int = field(metadata=spec(minimum=0))
    ratios: tuple[float, ...] = field(metadata=spec("each round's B / A"))
    verdict: str = field(metadata=spec("faster: the whole CI is above 1; slower: below 1; no difference: it contains 1; "
                                       "too few rounds: fewer than 6, whose CI covers less than 95%",
                                       enum=list(VERDICTS)))
    summary: str
    other_load_note: str | None = field(metadata=spec(
        "said when other processes' load was material during the comparison (and then, when an arm's turns "
        "ran at speeds 3x or more apart, that they did)"))
    usable_cores: int | None
    wall_time_s: float
    objective: str = field(default=THROUGHPUT, metadata=spec(
        "what the turns measured: throughput (windows of the real step) or latency (single batch-1 calls, each turn "
        "figured at its median call)", enum=[THROUGHPUT, LATENCY], required=False))

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Comparison":
        return from_json(cls, data)
