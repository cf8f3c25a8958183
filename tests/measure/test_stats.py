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


def test_a_figure_shows_the_digits_its_ci_supports_and_never_fewer_than_two_significant_ones():
    from torchpace.measure.stats import figure_text

    assert figure_text(9.5, 9.1, 9.9) == "9.5 [9.1, 9.9]"  # not "10"
    assert figure_text(1.3, 1.0, 13.0) == "1.3 [1.0, 13.0]"  # not "1 [1, 13]": a wide CI still keeps two digits
    assert figure_text(12345.6, 12001.0, 12700.2) == "12,346 [12,001, 12,700]"
    assert figure_text(812.44, 812.31, 812.52) == "812.4 [812.3, 812.5]"  # a narrow CI supports a decimal
    assert figure_text(1.0132, 1.0041, 1.0213) == "1.013 [1.004, 1.021]"
    assert figure_text(3.512, 2.527, 18.9) == "3.5 [2.5, 18.9]"
    assert figure_text(0.0512, 0.049, 0.053) == "0.051 [0.049, 0.053]"
    # no CI (or one of a single sample): three significant digits, no bounds
    assert figure_text(0.5912) == "0.591" and figure_text(2.527, 2.527, 2.527) == "2.53"
    assert figure_text(812.4) == "812" and figure_text(12345.6, None, None) == "12,346"


def test_a_ratio_says_its_ci_with_the_digits_it_supports_and_a_single_round_has_none():
    from torchpace.measure.stats import ratio_text, summary_ratio_text

    assert ratio_text(2.37, 0.39, 4.35, 2) == "2.37x [0.39, 4.35], 2 rounds (50% CI)"  # three digits: 1% decides
    assert ratio_text(1.32, 1.25, 1.40, 6) == "1.32x [1.25, 1.40], 6 rounds"
    assert ratio_text(1.32, None, None, 2) == "1.32x, 2 rounds" and ratio_text(None, None, None) == "-"
    assert ratio_text(2.527, 2.527, 2.527, 1) == "2.53x, 1 round (no CI)"  # not "0% CI 2.527-2.527"
    assert summary_ratio_text(summarize([2.527])) == ("2.53x", "1 round, no CI")
    ratio, said = summary_ratio_text(summarize([3.2, 2.527, 18.9, 3.512, 4.1]))
    assert ratio == "3.51x" and said == "93% CI 2.53-18.90, 5 rounds"
    assert summary_ratio_text(summarize([1.0132, 1.0041, 1.0213, 1.012, 1.015, 1.011]))[0] == "1.013x"
