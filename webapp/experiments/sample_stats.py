"""Statistics of plain samples of independent observations: Wilson and Student-t intervals,
percentiles, Newcombe's interval and the z-test for two proportions, Welch's t-test for two means,
the Beta chance to beat.

For the closed-loop benchmark's ground truth and the latency percentiles; experiment verdicts do
not use them (their unit is the user, not the observation: ``stats``). The conventions and result
types are ``stats``'s: plain numbers in, frozen dataclasses out, two-sided intervals at ``1 - alpha``.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import integrate, stats
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint, proportions_ztest

from webapp.experiments.sequential_tests import ALPHA, NO_COMPARISON, Comparison, Estimate, oriented, zero_se_comparison

# The Beta integral is taken over the variant posterior's central 1 - 2 * _TAIL mass.
_TAIL = 1e-12


def _check_counts(successes: int, trials: int) -> None:
    if trials < 0 or successes < 0 or successes > trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes}/{trials}")


def _clean(values: Sequence[float]) -> np.ndarray:
    """The finite values as a float array (NaN/inf entries are dropped)."""
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


# --- single arm -------------------------------------------------------------------------------

def wilson(successes: int, trials: int, alpha: float = ALPHA) -> Estimate:
    """Rate ``successes / trials`` with its Wilson score interval (all None when trials == 0)."""
    _check_counts(successes, trials)
    if trials == 0:
        return Estimate(None, None, None, 0)
    low, high = proportion_confint(successes, trials, alpha=alpha, method="wilson")
    return Estimate(successes / trials, float(low), float(high), trials)


def t_mean(values: Sequence[float], alpha: float = ALPHA) -> Estimate:
    """Mean with a Student-t interval; no interval below two values, a point one at zero variance."""
    arr = _clean(values)
    n = int(arr.size)
    if n == 0:
        return Estimate(None, None, None, 0)
    mean = float(arr.mean())
    if n < 2:
        return Estimate(mean, None, None, n)
    sem = float(stats.sem(arr))
    if sem == 0.0:
        return Estimate(mean, mean, mean, n)
    low, high = stats.t.interval(1 - alpha, n - 1, loc=mean, scale=sem)
    return Estimate(mean, float(low), float(high), n)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation) of the values; None when empty."""
    arr = _clean(values)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q, method="linear"))


# --- proportions ------------------------------------------------------------------------------

def prob_beta_greater(a_v: float, b_v: float, a_c: float, b_c: float) -> float:
    """P(theta_v > theta_c) for independent Beta(a_v, b_v) and Beta(a_c, b_c), by quadrature.

    Integrates pdf_v(x) * cdf_c(x) over the variant's central mass (all but 2e-12 of it), with
    both posterior means as break points so that sharply peaked posteriors are not missed.
    """
    post_v, post_c = stats.beta(a_v, b_v), stats.beta(a_c, b_c)
    lo, hi = post_v.ppf(_TAIL), post_v.isf(_TAIL)
    points = [x for x in (post_v.mean(), post_c.mean()) if lo < x < hi]
    value, _ = integrate.quad(lambda x: post_v.pdf(x) * post_c.cdf(x), lo, hi, points=points or None,
                              limit=200, epsabs=1e-12, epsrel=1e-10)
    return float(min(1.0, max(0.0, value)))


def _ztest_p(control: tuple[int, int], variant: tuple[int, int]) -> float:
    """Two-sided pooled two-proportion z-test; 1.0 when the pooled rate is 0 or 1 (no variance)."""
    (s_c, n_c), (s_v, n_v) = control, variant
    if s_c + s_v in (0, n_c + n_v):
        return 1.0
    _, p_value = proportions_ztest(np.array([s_v, s_c]), np.array([n_v, n_c]))
    return float(p_value)


def compare_proportions(control: tuple[int, int], variant: tuple[int, int], higher_is_better: bool = True,
                        alpha: float = ALPHA) -> Comparison:
    """Variant rate minus control rate for ``(successes, trials)`` arms; all None if an arm is empty."""
    (s_c, n_c), (s_v, n_v) = control, variant
    _check_counts(s_c, n_c)
    _check_counts(s_v, n_v)
    if n_c == 0 or n_v == 0:
        return NO_COMPARISON
    low, high = confint_proportions_2indep(s_v, n_v, s_c, n_c, method="newcomb", compare="diff", alpha=alpha)
    p_better = prob_beta_greater(1 + s_v, 1 + n_v - s_v, 1 + s_c, 1 + n_c - s_c)
    return Comparison(diff=s_v / n_v - s_c / n_c, low=float(low), high=float(high),
                      p_value=_ztest_p(control, variant),
                      chance_to_beat=oriented(p_better, higher_is_better))


# --- means ------------------------------------------------------------------------------------

def compare_means(control: Sequence[float], variant: Sequence[float], higher_is_better: bool = True,
                  alpha: float = ALPHA) -> Comparison:
    """Variant mean minus control mean by Welch's t-test; all None below two values in an arm."""
    c, v = _clean(control), _clean(variant)
    if c.size < 2 or v.size < 2:
        return NO_COMPARISON
    diff = float(v.mean() - c.mean())
    se = math.sqrt(v.var(ddof=1) / v.size + c.var(ddof=1) / c.size)
    if se == 0.0:
        return zero_se_comparison(diff, higher_is_better)
    with warnings.catch_warnings():  # scipy warns when one arm is constant; the test is still valid
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        result = stats.ttest_ind(v, c, equal_var=False)
    ci = result.confidence_interval(confidence_level=1 - alpha)
    p_better = stats.norm.cdf(diff / se)
    return Comparison(diff=diff, low=float(ci.low), high=float(ci.high), p_value=float(result.pvalue),
                      chance_to_beat=oriented(p_better, higher_is_better))
