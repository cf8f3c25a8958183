import math

import pytest

from torchpace.measure.stats import MIN_WINDOWS_FOR_CI, ci_name, median_ci_ranks, summarize, windows_agree


@pytest.mark.parametrize("n", [6, 7, 10, 20, 51, 200])
def test_median_ci_reaches_95_percent_coverage_with_narrowest_symmetric_ranks(n):
    lo, hi, coverage = median_ci_ranks(n)
    assert coverage >= 0.95
    assert hi == n - 1 - lo
    if lo + 1 < n // 2:  # one rank narrower would fall below 95%
        narrower = sum(math.comb(n, k) for k in range(lo + 2, n - lo - 1)) / 2**n
        assert narrower < 0.95


def test_too_few_windows_report_their_lower_coverage():
    lo, hi, coverage = median_ci_ranks(MIN_WINDOWS_FOR_CI - 1)
    assert (lo, hi) == (0, MIN_WINDOWS_FOR_CI - 2)
    assert coverage < 0.95


@pytest.mark.parametrize("n, name", [(1, "0% CI"), (2, "50% CI"), (3, "75% CI"), (4, "87% CI"), (5, "93% CI"),
                                     (MIN_WINDOWS_FOR_CI, "95% CI"), (40, "95% CI")])
def test_a_ci_is_named_by_the_coverage_it_has(n, name):
    summary = summarize([float(v) for v in range(n)])
    assert ci_name(n) == summary.ci_name == name
    assert summary.full_ci is (n >= MIN_WINDOWS_FOR_CI)


def test_summary_median_ci_iqr_and_noise_flag():
    tight = summarize([100.0, 101.0, 99.0, 100.5, 99.5, 100.0, 100.2, 99.8])
    assert tight.median == pytest.approx(100.0)
    assert tight.ci_low <= tight.median <= tight.ci_high
    assert tight.ci_rel_halfwidth < 0.02
    assert not tight.noisy
    noisy = summarize([100.0, 150.0, 60.0, 120.0, 80.0, 140.0, 70.0, 100.0])
    assert noisy.noisy and noisy.iqr_frac > 0.10


def test_one_slow_outlier_window_does_not_move_the_median():
    values = [100.0] * 9 + [5.0]
    assert summarize(values).median == 100.0


def test_windows_agree_is_relative_and_symmetric():
    assert windows_agree(100, 104, 0.05) and windows_agree(104, 100, 0.05)
    assert not windows_agree(100, 120, 0.05)
