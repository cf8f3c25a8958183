"""Pure statistics over per-window throughputs.

Method (in the spirit of `torch.utils.benchmark`): the unit of measurement is a *window* of several
steps, timed as a whole, so per-step timer overhead and CUDA syncs stay out of the steps. Each window
gives one samples/s figure. We report the median over windows, a distribution-free 95% confidence
interval of that median (binomial order statistics: no normality assumed, robust to the odd slow
window), and the interquartile range. IQR/median above 10% earns a noise warning.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

_CONFIDENCE = 0.95
_IQR_WARN_THRESHOLD = 0.10  # torch.utils.benchmark warns when IQR exceeds 10% of the median
MIN_WINDOWS_FOR_CI = 6  # the fewest samples whose extreme order statistics reach 95% coverage


@dataclass(frozen=True)
class Summary:
    """Median with its 95% CI and IQR over `n` window figures (same unit as the inputs)."""

    n: int
    median: float
    ci_low: float
    ci_high: float
    ci_coverage: float
    iqr: float

    @property
    def ci_rel_halfwidth(self) -> float:
        """Half the CI width relative to the median (0.02 means ±2%)."""
        return (self.ci_high - self.ci_low) / 2 / self.median if self.median else math.inf

    @property
    def full_ci(self) -> bool:
        """Whether the CI reaches its 95% coverage (it needs `MIN_WINDOWS_FOR_CI` samples)."""
        return self.ci_coverage >= _CONFIDENCE

    @property
    def ci_name(self) -> str:
        """What every text calls this CI (see `ci_name`)."""
        return _named(self.ci_coverage)

    @property
    def iqr_frac(self) -> float:
        return self.iqr / self.median if self.median else math.inf

    @property
    def noisy(self) -> bool:
        return self.iqr_frac > _IQR_WARN_THRESHOLD


def median_ci_ranks(n: int, confidence: float = _CONFIDENCE) -> tuple[int, int, float]:
    """0-based ranks (lo, hi) of sorted samples bounding the median with >= `confidence` coverage.

    Coverage of [x_(l), x_(n-1-l)] is P(l < B <= n-1-l) for B ~ Binomial(n, 1/2). Returns the
    narrowest symmetric pair reaching `confidence`, or (0, n-1) with its lower coverage when n is
    too small.
    """
    if n < 1:
        raise ValueError("need at least one sample")
    best = (0, n - 1, _coverage(n, 0))
    for lo in range(1, n // 2):
        coverage = _coverage(n, lo)
        if coverage < confidence:
            break
        best = (lo, n - 1 - lo, coverage)
    return best


def ci_name(n: int) -> str:
    """What every text calls the CI of a median of `n` samples: `95% CI`, or the coverage it has with fewer
    than `MIN_WINDOWS_FOR_CI` (`50% CI` on 2, `0% CI` on 1)."""
    return _named(median_ci_ranks(n)[2] if n > 0 else 0.0)


def _named(coverage: float) -> str:
    return f"{_CONFIDENCE:.0%} CI" if coverage >= _CONFIDENCE else f"{math.floor(coverage * 100):.0f}% CI"


def _coverage(n: int, lo: int) -> float:
    """P(x_(lo) <= median <= x_(n-1-lo)) for n i.i.d. samples (0-based ranks)."""
    return sum(math.comb(n, k) for k in range(lo + 1, n - lo)) / 2**n if n > 1 else 0.0


def summarize(values: list[float], confidence: float = _CONFIDENCE) -> Summary:
    """Median, its order-statistic CI, and the IQR of `values`."""
    ordered = sorted(values)
    n = len(ordered)
    lo, hi, coverage = median_ci_ranks(n, confidence)
    if n >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return Summary(n, statistics.median(ordered), ordered[lo], ordered[hi], coverage, q3 - q1)


def windows_agree(a: float, b: float, tolerance: float) -> bool:
    """True when two consecutive window figures differ by at most `tolerance` (relative)."""
    return abs(a - b) <= tolerance * max(abs(a), abs(b))


# How a figure is written (every output: terminal, the texts stored with a study, the report): the digits its
# CI supports, the CI's half-width to one significant digit; never fewer than two significant digits of the
# figure itself (a wide CI around a small figure: 1.3 [1.0, 13.0], not 1 [1, 13]); three without a CI. A ratio
# keeps three (1.01x): the decisions it states are taken against a gain of 1%.
_LEAST_DIGITS = 2
_RATIO_DIGITS = 3
_DIGITS_WITHOUT_CI = 3
_MAX_DECIMALS = 6


def figure_decimals(value: float, low: float | None = None, high: float | None = None, least: int = _LEAST_DIGITS) -> int:
    """Decimals to write `value` (and its CI `low`-`high`) with: see `figure_text`."""
    if not math.isfinite(value) or value == 0:
        return 0
    magnitude = math.floor(math.log10(abs(value)))
    has_ci = low is not None and high is not None and math.isfinite(low) and math.isfinite(high) and high > low
    least = (least if has_ci else max(least, _DIGITS_WITHOUT_CI)) - 1 - magnitude
    from_ci = -math.floor(math.log10((high - low) / 2)) if has_ci else 0
    return min(_MAX_DECIMALS, max(0, least, from_ci))


def figure_text(value: float, low: float | None = None, high: float | None = None, least: int = _LEAST_DIGITS) -> str:
    """`9.5 [9.1, 9.9]`: a figure and its CI with the digits the CI supports (its half-width to one significant
    digit), never fewer than `least` significant digits of the figure; `0.591` (three) without a CI or with one
    of no width (a single sample's)."""
    digits = figure_decimals(value, low, high, least)
    text = f"{value:,.{digits}f}"
    if low is None or high is None or not high > low:
        return text
    return f"{text} [{low:,.{digits}f}, {high:,.{digits}f}]"


def ratio_text(ratio: float | None, low: float | None, high: float | None, rounds: int | None = None) -> str:
    """`1.32x [1.25, 1.40], 6 rounds` (the digits as `figure_text`, at least three); with fewer rounds than a 95% CI
    needs, the coverage the CI has: `2.37x [0.39, 4.35], 2 rounds (50% CI)`; a single round has no CI: `2.53x, 1
    round (no CI)`; `-` without a ratio."""
    if ratio is None:
        return "-"
    single = rounds == 1 or (low is not None and low == high)
    text = figure_text(ratio, None, None, _RATIO_DIGITS) if single else figure_text(ratio, low, high, _RATIO_DIGITS)
    value, _, bounds = text.partition(" ")
    said = f"{value}x" + (f" {bounds}" if bounds else "")
    if not rounds:
        return said
    if single:
        return f"{said}, 1 round (no CI)" if rounds == 1 else f"{said}, {rounds} rounds"
    short = f" ({ci_name(rounds)})" if bounds and rounds < MIN_WINDOWS_FOR_CI else ""
    return f"{said}, {rounds} rounds{short}"


def summary_ratio_text(summary: Summary) -> tuple[str, str]:
    """(a median ratio, its interval in words), with the digits as `ratio_text`: (`1.013x`, `95% CI
    1.004-1.021, 8 rounds`); a single round has none: (`2.53x`, `1 round, no CI`)."""
    if summary.n < 2 or not summary.ci_high > summary.ci_low:
        rounds = "1 round" if summary.n == 1 else f"{summary.n} rounds"
        return f"{figure_text(summary.median, least=_RATIO_DIGITS)}x", f"{rounds}, no CI"
    digits = figure_decimals(summary.median, summary.ci_low, summary.ci_high, _RATIO_DIGITS)
    return (f"{summary.median:,.{digits}f}x",
            f"{summary.ci_name} {summary.ci_low:,.{digits}f}-{summary.ci_high:,.{digits}f}, {summary.n} rounds")
