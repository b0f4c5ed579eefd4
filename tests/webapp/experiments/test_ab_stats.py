"""A/B statistics (webapp/experiments/sequential_tests.py, sample_stats.py), each checked against
closed-form arithmetic done here or against GrowthBook's published test results."""
from __future__ import annotations

import ast
import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
from scipy import stats

from webapp.experiments import sample_stats
from webapp.experiments import sequential_tests as ab_stats
from webapp.experiments.sample_stats import (
    compare_means,
    compare_proportions,
    percentile,
    prob_beta_greater,
    t_mean,
    wilson,
)
from webapp.experiments.sequential_tests import (
    ALPHA,
    Comparison,
    Estimate,
    RatioArm,
    always_valid_p,
    compare_ratio_arms,
    compare_ratio_to,
    cs_halfwidth,
    enough_data,
    ratio_arm,
    ratio_estimate,
    sequential_mde,
    sequential_rho,
    srm_check,
    users_needed,
)

Z = 1.959963984540054  # standard normal 97.5% quantile
T_975_7 = 2.3646242510102993  # Student t 97.5% quantile, 7 degrees of freedom (table value)


def wilson_by_hand(s: int, n: int) -> tuple[float, float]:
    p = s / n
    center = (p + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z / (1 + Z**2 / n) * math.sqrt(p * (1 - p) / n + Z**2 / (4 * n**2))
    return center - half, center + half


def phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def beta_greater_closed_form(a_v: int, b_v: int, a_c: int, b_c: int) -> float:
    """Exact P(Beta(a_v, b_v) > Beta(a_c, b_c)) for integer a_v (Evan Miller's sum), in log space."""
    def lbeta(a, b):
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    return sum(math.exp(lbeta(a_c + i, b_c + b_v) - math.log(b_v + i) - lbeta(1 + i, b_v) - lbeta(a_c, b_c))
               for i in range(a_v))


# --- module hygiene ---------------------------------------------------------------------------

@pytest.mark.parametrize("module", [ab_stats, sample_stats])
def test_module_imports_only_stdlib_and_scientific_packages(module):
    """The statistics modules import the standard library, the scientific packages and each other."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert not any(isinstance(node, ast.ImportFrom) and node.level > 0 for node in ast.walk(tree))
    roots = {name.split(".")[0] for name in names - {"webapp.experiments.sequential_tests"}}
    assert roots <= {"__future__", "math", "warnings", "collections", "dataclasses", "typing", "numpy", "scipy",
                     "statsmodels"}


def test_alpha_and_results_are_frozen_and_json_serialisable():
    assert ALPHA == 0.05
    est = wilson(45, 100)
    with pytest.raises(AttributeError):
        est.value = 0.5  # type: ignore[misc]
    comp = compare_proportions((40, 200), (60, 200))
    json.dumps([asdict(est), asdict(comp), asdict(compare_means([1, 2, 3], [2, 3, 5])),
                srm_check({"control": 5200, "variant": 4800}, {"control": 0.5, "variant": 0.5})])
    assert all(type(x) is float for x in (est.value, est.low, est.high, comp.diff, comp.p_value,
                                          comp.chance_to_beat))


# --- wilson -----------------------------------------------------------------------------------

def test_wilson_matches_the_score_formula():
    low, high = wilson_by_hand(45, 100)
    est = wilson(45, 100)
    assert est == Estimate(pytest.approx(0.45), pytest.approx(low), pytest.approx(high), 100)
    assert (low, high) == pytest.approx((0.35614537979511973, 0.5475539700255787))


def test_wilson_at_the_boundaries_stays_in_unit_interval():
    zero, full = wilson(0, 10), wilson(10, 10)
    assert zero.value == 0 and zero.low == pytest.approx(0, abs=1e-12)
    assert zero.high == pytest.approx(wilson_by_hand(0, 10)[1]) == pytest.approx(Z**2 / (10 + Z**2))
    assert full.high == pytest.approx(1) and full.low == pytest.approx(10 / (10 + Z**2))


def test_wilson_without_trials_is_empty():
    assert wilson(0, 0) == Estimate(None, None, None, 0)


def test_wilson_rejects_impossible_counts():
    with pytest.raises(ValueError):
        wilson(5, 4)
    with pytest.raises(ValueError):
        wilson(-1, 4)


# --- t_mean -----------------------------------------------------------------------------------

def test_t_mean_matches_the_student_formula():
    values = [2, 4, 4, 4, 5, 5, 7, 9]  # mean 5, sum of squared deviations 32
    sem = math.sqrt(32 / 7 / 8)
    assert stats.t.ppf(0.975, 7) == pytest.approx(T_975_7)
    est = t_mean(values)
    assert est.value == pytest.approx(5) and est.n == 8
    assert (est.low, est.high) == pytest.approx((5 - T_975_7 * sem, 5 + T_975_7 * sem))


def test_t_mean_small_and_degenerate_samples():
    assert t_mean([]) == Estimate(None, None, None, 0)
    assert t_mean([3.5]) == Estimate(3.5, None, None, 1)
    assert t_mean([3, 3, 3]) == Estimate(3.0, 3.0, 3.0, 3)


def test_t_mean_ignores_non_finite_values():
    assert t_mean([1, float("nan"), 3]) == t_mean([1, 3])


# --- compare_proportions ----------------------------------------------------------------------

def test_compare_proportions_against_hand_computation():
    (s_c, n_c), (s_v, n_v) = (40, 200), (60, 200)
    p_c, p_v = s_c / n_c, s_v / n_v
    pooled = (s_c + s_v) / (n_c + n_v)
    z = (p_v - p_c) / math.sqrt(pooled * (1 - pooled) * (1 / n_c + 1 / n_v))
    p_value = math.erfc(abs(z) / math.sqrt(2))
    l_c, u_c = wilson_by_hand(s_c, n_c)
    l_v, u_v = wilson_by_hand(s_v, n_v)
    diff = p_v - p_c  # Newcombe's hybrid score interval (method 10)
    low = diff - math.sqrt((p_v - l_v) ** 2 + (u_c - p_c) ** 2)
    high = diff + math.sqrt((u_v - p_v) ** 2 + (p_c - l_c) ** 2)

    comp = compare_proportions((s_c, n_c), (s_v, n_v))
    assert comp.diff == pytest.approx(0.1)
    assert (comp.low, comp.high) == pytest.approx((low, high))
    assert comp.p_value == pytest.approx(p_value)
    assert comp.chance_to_beat == pytest.approx(beta_greater_closed_form(61, 141, 41, 161), abs=1e-9)
    assert comp.chance_to_beat > 0.98


def test_chance_to_beat_beta2_1_vs_beta1_2_is_five_sixths():
    # P(X > Y), X ~ Beta(2,1) (pdf 2x), Y ~ Beta(1,2) (cdf 2y - y^2):
    # integral_0^1 2x (2x - x^2) dx = 4/3 - 1/2 = 5/6
    assert beta_greater_closed_form(2, 1, 1, 2) == pytest.approx(5 / 6)
    assert prob_beta_greater(2, 1, 1, 2) == pytest.approx(5 / 6, abs=1e-10)
    assert compare_proportions((0, 1), (1, 1)).chance_to_beat == pytest.approx(5 / 6, abs=1e-10)
    assert compare_proportions((1, 1), (0, 1)).chance_to_beat == pytest.approx(1 / 6, abs=1e-10)


def test_chance_to_beat_is_one_half_for_identical_arms():
    for counts in [(0, 1), (3, 10), (500, 1000), (9_990, 10_000)]:
        assert compare_proportions(counts, counts).chance_to_beat == pytest.approx(0.5, abs=1e-9)


def test_chance_to_beat_with_large_peaked_posteriors_matches_closed_form():
    comp = compare_proportions((5_000, 10_000), (5_100, 10_000))
    exact = beta_greater_closed_form(5_101, 4_901, 5_001, 5_001)
    assert comp.chance_to_beat == pytest.approx(exact, abs=1e-8)
    # and roughly the normal approximation of the difference
    se = math.sqrt(0.5 * 0.5 / 10_000 + 0.51 * 0.49 / 10_000)
    assert comp.chance_to_beat == pytest.approx(phi(0.01 / se), abs=2e-3)


def test_lower_is_better_flips_chance_to_beat_only():
    up = compare_proportions((40, 200), (60, 200))
    down = compare_proportions((40, 200), (60, 200), higher_is_better=False)
    assert down.chance_to_beat == pytest.approx(1 - up.chance_to_beat)
    assert (down.diff, down.low, down.high, down.p_value) == (up.diff, up.low, up.high, up.p_value)
    assert compare_proportions((0, 1), (1, 1), higher_is_better=False).chance_to_beat == pytest.approx(1 / 6)


def test_compare_proportions_with_an_empty_arm_is_all_none():
    none = Comparison(None, None, None, None, None)
    assert compare_proportions((0, 0), (5, 10)) == none
    assert compare_proportions((5, 10), (0, 0)) == none
    assert compare_proportions((0, 0), (0, 0)) == none


def test_compare_proportions_without_any_variance_does_not_raise():
    # X ~ Beta(1, a), Y ~ Beta(1, b): P(X > Y) = 1 - integral a (1-x)^(a-1) (1-x)^b dx = b / (a + b),
    # and by symmetry P(Beta(a, 1) > Beta(b, 1)) = a / (a + b)
    for arms, chance in [(((0, 10), (0, 20)), 11 / 32), (((10, 10), (20, 20)), 21 / 32)]:
        comp = compare_proportions(*arms)
        assert comp.diff == 0 and comp.p_value == 1.0
        assert comp.low < 0 < comp.high
        assert comp.chance_to_beat == pytest.approx(chance, abs=1e-10)


def test_compare_proportions_rejects_impossible_counts():
    with pytest.raises(ValueError):
        compare_proportions((11, 10), (1, 10))


# --- compare_means ----------------------------------------------------------------------------

def test_compare_means_welch_against_hand_computation():
    control, variant = [1, 2, 3, 4, 5], [2, 4, 6, 8, 10, 12]
    m_c, m_v = 3.0, 7.0
    var_c = sum((x - m_c) ** 2 for x in control) / 4  # 10 / 4 = 2.5
    var_v = sum((x - m_v) ** 2 for x in variant) / 5  # 70 / 5 = 14
    a, b = var_c / 5, var_v / 6
    se = math.sqrt(a + b)
    t = (m_v - m_c) / se
    df = (a + b) ** 2 / (a**2 / 4 + b**2 / 5)  # Welch-Satterthwaite
    crit = stats.t.ppf(0.975, df)

    comp = compare_means(control, variant)
    assert comp.diff == pytest.approx(4.0)
    assert comp.p_value == pytest.approx(2 * stats.t.sf(abs(t), df))
    assert (comp.low, comp.high) == pytest.approx((4 - crit * se, 4 + crit * se))
    assert comp.chance_to_beat == pytest.approx(phi(4 / se))
    lower = compare_means(control, variant, higher_is_better=False)
    assert lower.chance_to_beat == pytest.approx(1 - phi(4 / se))
    assert lower.p_value == comp.p_value


def test_compare_means_alpha_widens_interval():
    control, variant = [1, 2, 3, 4, 5], [2, 4, 6, 8, 10, 12]
    wide, narrow = compare_means(control, variant, alpha=0.01), compare_means(control, variant, alpha=0.2)
    assert wide.low < narrow.low < narrow.high < wide.high


def test_compare_means_needs_two_values_per_arm():
    none = Comparison(None, None, None, None, None)
    assert compare_means([], []) == none
    assert compare_means([1.0], [1.0, 2.0]) == none
    assert compare_means([1.0, 2.0], [3.0]) == none


def test_compare_means_with_zero_variance_in_both_arms():
    assert compare_means([1, 1, 1], [2, 2]) == Comparison(1.0, 1.0, 1.0, 0.0, 1.0)
    assert compare_means([1, 1, 1], [2, 2], higher_is_better=False) == Comparison(1.0, 1.0, 1.0, 0.0, 0.0)
    assert compare_means([2, 2], [1, 1, 1]).chance_to_beat == 0.0
    assert compare_means([3, 3], [3, 3, 3]) == Comparison(0.0, 0.0, 0.0, 1.0, 0.5)


def test_compare_means_with_one_constant_arm():
    comp = compare_means([1, 1, 1], [1, 2, 3])
    se = math.sqrt(1 / 3)  # only the variant contributes: var 1, n 3
    assert comp.diff == pytest.approx(1.0)
    assert comp.p_value == pytest.approx(2 * stats.t.sf(1 / se, 2))
    assert comp.chance_to_beat == pytest.approx(phi(1 / se))


# --- percentile -------------------------------------------------------------------------------

def test_percentile_interpolates_linearly():
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([1, 2, 3, 4], 90) == pytest.approx(1 + 0.9 * 3)
    assert percentile([7], 95) == 7.0
    assert percentile([], 50) is None


# --- srm_check --------------------------------------------------------------------------------

def test_srm_flags_a_skewed_split():
    result = srm_check({"control": 5200, "variant": 4800}, {"control": 0.5, "variant": 0.5})
    assert result["chi2"] == pytest.approx(200**2 / 5000 * 2) == pytest.approx(16.0)
    # one degree of freedom: P(chi2 > 16) = P(|Z| > 4)
    assert result["p_value"] == pytest.approx(stats.chi2.sf(16, 1)) == pytest.approx(math.erfc(4 / math.sqrt(2)))
    assert result["mismatch"] is True
    assert result["observed"] == {"control": 5200, "variant": 4800}
    assert result["expected"] == {"control": 5000.0, "variant": 5000.0}


def test_srm_accepts_a_balanced_split():
    result = srm_check({"control": 5010, "variant": 4990}, {"control": 0.5, "variant": 0.5})
    assert result["chi2"] == pytest.approx(10**2 / 5000 * 2)
    assert result["p_value"] == pytest.approx(stats.chi2.sf(0.04, 1))
    assert result["mismatch"] is False


def test_srm_with_an_uneven_split_and_threshold():
    # 10/90 split of 1000 users: expected 100/900, observed 140/860
    chi2 = 40**2 / 100 + 40**2 / 900
    result = srm_check({"control": 860, "variant": 140}, {"control": 0.9, "variant": 0.1})
    assert result["chi2"] == pytest.approx(chi2)
    assert result["expected"] == pytest.approx({"control": 900.0, "variant": 100.0})
    assert result["mismatch"] is True
    assert srm_check({"control": 890, "variant": 110}, {"control": 0.9, "variant": 0.1})["mismatch"] is False
    loose = srm_check({"control": 890, "variant": 110}, {"control": 0.9, "variant": 0.1}, threshold=0.5)
    assert loose["mismatch"] is True


def test_srm_without_users():
    result = srm_check({}, {"control": 0.5, "variant": 0.5})
    assert result["chi2"] is None and result["p_value"] is None and result["mismatch"] is False
    assert result["observed"] == {"control": 0, "variant": 0}
    assert srm_check({"control": 0, "variant": 0}, {"control": 0.5, "variant": 0.5})["mismatch"] is False


def test_srm_edge_arms():
    missing_arm = srm_check({"control": 20}, {"control": 0.5, "variant": 0.5})
    assert missing_arm["chi2"] == pytest.approx(20.0) and missing_arm["mismatch"] is True
    zero_share = srm_check({"control": 10, "variant": 1}, {"control": 1.0, "variant": 0.0})
    assert zero_share["mismatch"] is True and zero_share["p_value"] == 0.0
    assert srm_check({"control": 10}, {"control": 1.0, "variant": 0.0})["p_value"] is None
    with pytest.raises(ValueError):
        srm_check({"control": 1, "other": 2}, {"control": 0.5, "variant": 0.5})


# --- enough_data ------------------------------------------------------------------------------

def test_enough_data_requires_both_arms():
    assert enough_data(100, 100, 100) is True
    assert enough_data(99, 500, 100) is False
    assert enough_data(500, 99, 100) is False
    assert enough_data(0, 0, 0) is True


# --- ratio metrics over users: the delta method -----------------------------------------------

def test_delta_method_variance_of_a_ratio_by_hand():
    # four users: thumbs up / thumbs given
    ups, thumbs = [1, 2, 0, 3], [2, 2, 1, 4]
    # R = 6 / 9; residuals N - R D = -1/3, 2/3, -2/3, 1/3 (sum of squares 10/9, over n - 1: 10/27);
    # mean(D) = 9/4, so Var(R) = (10/27) / (4 * (9/4)^2) = 40/2187
    arm = ratio_arm(ups, thumbs)
    assert arm.value == pytest.approx(2 / 3)
    assert arm.variance == pytest.approx(40 / 2187)
    assert (arm.users, arm.users_with_data, arm.total) == (4, 4, 9.0)
    # the same from the three sample moments (GrowthBook's RatioStatistic): s_N^2 = 5/3,
    # s_D^2 = 4.75/3, s_ND = 1.5
    three_terms = (5 / 3 - 2 * (2 / 3) * 1.5 + (2 / 3) ** 2 * 4.75 / 3) / (4 * (9 / 4) ** 2)
    assert arm.variance == pytest.approx(three_terms)
    est = ratio_estimate(arm)
    assert (est.low, est.high) == pytest.approx((2 / 3 - Z * math.sqrt(40 / 2187), 2 / 3 + Z * math.sqrt(40 / 2187)))


def test_users_without_data_change_neither_the_ratio_nor_much_its_variance():
    with_silent = ratio_arm([1, 2, 0, 3, 0, 0], [2, 2, 1, 4, 0, 0])
    assert with_silent.value == pytest.approx(2 / 3) and with_silent.users == 6 and with_silent.users_with_data == 4
    # sum of squared residuals 10/9 over n - 1 = 5, divided by n * mean(D)^2 = 81/6
    assert with_silent.variance == pytest.approx((10 / 9 / 5) / (6 * (9 / 6) ** 2))


def test_a_heavy_user_counts_as_one_user_not_as_many_trials():
    # one user gave 40 thumbs up, five gave one thumb down each: 40/45 up
    heavy = ratio_arm([40, 0, 0, 0, 0, 0], [40, 1, 1, 1, 1, 1])
    binomial_se = math.sqrt((40 / 45) * (5 / 45) / 45)
    assert heavy.value == pytest.approx(40 / 45)
    assert math.sqrt(heavy.variance) > 2.5 * binomial_se  # answers as independent trials: far too narrow
    # users alike: close to the binomial figure
    alike = ratio_arm([1] * 40 + [0] * 5, [1] * 45)
    assert math.sqrt(alike.variance) == pytest.approx(binomial_se, rel=0.02)


def test_ratio_arm_without_data():
    assert ratio_arm([], []) == RatioArm(None, None, 0, 0, 0.0)
    assert ratio_arm([0, 0], [0, 0]) == RatioArm(None, None, 2, 0, 0.0)
    assert ratio_arm([1], [2]) == RatioArm(0.5, None, 1, 1, 2.0)
    assert ratio_estimate(ratio_arm([1], [2])) == Estimate(0.5, None, None, 1)
    with pytest.raises(ValueError):
        ratio_arm([1, 2], [1])


def test_compare_ratio_arms_fixed_horizon_by_hand():
    control, variant = ratio_arm([1, 2, 0, 3], [2, 2, 1, 4]), ratio_arm([2, 2, 1, 3], [2, 2, 2, 4])
    diff = 8 / 10 - 6 / 9
    se = math.sqrt(control.variance + variant.variance)
    fixed, seq = compare_ratio_arms(control, variant)
    assert fixed.diff == pytest.approx(diff)
    assert (fixed.low, fixed.high) == pytest.approx((diff - Z * se, diff + Z * se))
    assert fixed.p_value == pytest.approx(math.erfc(abs(diff / se) / math.sqrt(2)))
    assert fixed.chance_to_beat == pytest.approx(phi(diff / se))
    assert seq.n == 8 and seq.tuning == 5000
    half = cs_halfwidth(se, 8)
    assert (seq.low, seq.high) == pytest.approx((diff - half, diff + half))
    assert seq.low < fixed.low and seq.high > fixed.high  # always-valid costs width
    assert compare_ratio_arms(ratio_arm([1], [1]), variant) == (Comparison(None, None, None, None, None),
                                                                 ab_stats._NO_SEQUENTIAL)


def test_compare_ratio_to_a_fixed_value():
    wins = ratio_arm([3, 1, 2, 0, 2], [3, 2, 2, 1, 2])  # 8 of 10 decisive votes
    fixed, seq = compare_ratio_to(wins, 0.5)
    se = math.sqrt(wins.variance)
    assert fixed.diff == pytest.approx(0.3) and fixed.p_value == pytest.approx(math.erfc(0.3 / se / math.sqrt(2)))
    assert seq.n == 5 and (seq.low, seq.high) == pytest.approx((0.3 - cs_halfwidth(se, 5), 0.3 + cs_halfwidth(se, 5)))


# --- confidence sequences (GrowthBook's SequentialTwoSidedTTest) ------------------------------

def test_rho_by_hand():
    a = -2 * math.log(0.05)
    assert sequential_rho(0.05, 5000) == pytest.approx(math.sqrt((a + math.log(a + 1)) / 5000))
    assert sequential_rho(0.05, 5000) == pytest.approx(0.039840, abs=1e-6)
    with pytest.raises(ValueError):
        sequential_rho(0.05, 0)


def test_halfwidth_is_growthbooks_formula():
    se, n, tuning = 0.02, 1000, 5000
    rho2 = sequential_rho(0.05, tuning) ** 2
    s2 = se**2 * n
    by_hand = math.sqrt(s2) * math.sqrt(2 * (n * rho2 + 1) * math.log(math.sqrt(n * rho2 + 1) / 0.05) / (n * n * rho2))
    assert cs_halfwidth(se, n, 0.05, tuning) == pytest.approx(by_hand)
    # n rho^2 = 1.58724: sqrt(2 * 2.58724 / 1.58724 * log(sqrt(2.58724) / 0.05)) = 3.3639 standard errors
    assert cs_halfwidth(se, n, 0.05, tuning) == pytest.approx(3.3639 * se, abs=1e-5)
    assert cs_halfwidth(se, n) > Z * se


def _relative_se(mean_a, var_a, n_a, mean_b, var_b, n_b):
    """GrowthBook's delta-method standard error of the relative lift (b - a) / a."""
    return math.sqrt(var_b / (mean_a**2 * n_b) + var_a * mean_b**2 / (mean_a**4 * n_a))


def test_growthbooks_published_sequential_results():
    # gbstats tests/frequentist/test_tests.py, TestSequentialTTest.test_sequential_test_runs_prop:
    # ProportionStatistic(sum=1396, n=3000) vs (sum=2422, n=3461), tuning 5000 -> ci [0.40098, 0.60675]
    pa, pb = 1396 / 3000, 2422 / 3461
    lift = (pb - pa) / pa
    se = _relative_se(pa, pa * (1 - pa), 3000, pb, pb * (1 - pb), 3461)
    assert (lift, se) == pytest.approx((0.50386, 0.03386), abs=5e-6)
    half = cs_halfwidth(se, 6461, 0.05, 5000)
    assert (lift - half, lift + half) == pytest.approx((0.40098, 0.60675), abs=5e-6)
    assert always_valid_p(lift, se, 6461, 0.05, 5000) == pytest.approx(0.0, abs=1e-12)
    # test_sequential_test_runs: SampleMeanStatistic(sum=1396.87, sum_squares=52377.9767, n=3000) vs
    # (sum=2422.7, sum_squares=134698.29, n=3461), tuning 1000 -> ci [-0.55844, 1.56516], p-value 1
    ma, mb = 1396.87 / 3000, 2422.7 / 3461
    va, vb = (52377.9767 - 3000 * ma**2) / 2999, (134698.29 - 3461 * mb**2) / 3460
    lift, se = (mb - ma) / ma, _relative_se(ma, va, 3000, mb, vb, 3461)
    assert (lift, se) == pytest.approx((0.50336, 0.33341), abs=5e-6)
    half = cs_halfwidth(se, 6461, 0.05, 1000)
    assert (lift - half, lift + half) == pytest.approx((-0.55844, 1.56516), abs=5e-6)
    assert always_valid_p(lift, se, 6461, 0.05, 1000) == 1.0


def test_tuning_parameter_narrows_the_sequence_near_its_value():
    # GrowthBook's test_sequential_test_tuning_as_expected, on our function: n = 6461
    widths = {t: cs_halfwidth(0.1, 6461, 0.05, t) for t in (10, 6461, 10_000)}
    assert widths[6461] < widths[10_000] < widths[10]


def test_always_valid_p_agrees_with_the_sequence():
    se, n = 0.03, 400
    half = cs_halfwidth(se, n)
    assert always_valid_p(half * 1.001, se, n) < 0.05 < always_valid_p(half * 0.999, se, n)
    assert always_valid_p(-half * 1.001, se, n) < 0.05
    assert always_valid_p(0.0, se, n) == 1.0
    # the e-value by hand: S^2 = n diff^2 / se^2; e = exp(rho^2 S^2 / (2 (n rho^2 + 1))) / sqrt(n rho^2 + 1)
    rho2, diff = sequential_rho(0.05) ** 2, 0.2
    e = math.exp(rho2 * n * diff**2 / se**2 / (2 * (n * rho2 + 1))) / math.sqrt(n * rho2 + 1)
    assert always_valid_p(diff, se, n) == pytest.approx(1 / e)
    assert always_valid_p(0.1, 0.0, n) == 0.0 and always_valid_p(0.0, 0.0, n) == 1.0


def test_mde_and_users_needed():
    se, n = 0.04, 300
    assert sequential_mde(se, n) == pytest.approx(cs_halfwidth(se, n) + 0.8416212335729143 * se)
    needed = users_needed(se, n, 0.05)
    s2 = se**2 * n  # per-user variance stays; the standard error shrinks as 1/sqrt(users)
    assert sequential_mde(math.sqrt(s2 / needed), needed) <= 0.05 < sequential_mde(math.sqrt(s2 / (needed - 1)),
                                                                                   needed - 1)
    assert users_needed(se, n, 1.0) == n  # already enough
    assert users_needed(se, n, 1e-7) is None  # beyond a billion users: never
    with pytest.raises(ValueError):
        users_needed(se, n, 0)
