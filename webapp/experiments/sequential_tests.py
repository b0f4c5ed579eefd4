"""Pure statistics for A/B experiment verdicts: a "variant" arm compared against a "control" arm.

No Flask, no database: plain numbers in, plain dataclasses/dicts out (Python floats, so the
results serialise to JSON). Intervals are two-sided at level ``1 - alpha`` (95% by default).

What experiment verdicts use (users are the unit of analysis; see docs/experiments.md, "How
verdicts are computed"):

* ratio metrics over users (``ratio_arm``): sum of per-user numerators over sum of per-user
  denominators, with the delta-method variance (as GrowthBook's ratio metrics);
* their difference (``compare_ratio_arms``, ``compare_ratio_to``): a fixed-horizon z interval
  and p-value for reference, and the asymptotic confidence sequence of Waudby-Smith et al.
  (GrowthBook's ``SequentialTwoSidedTTest``) with its always-valid p-value, which stays valid
  however often it is looked at;
* power of that sequential test (``sequential_mde``, ``users_needed``);
* sample-ratio mismatch: chi-square goodness of fit of users per arm against the split.

The per-observation helpers (Wilson and Student-t intervals, Newcombe, Welch, Beta chance to beat)
for plain samples of independent observations are in ``sample_stats``; verdicts do not use them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize, special

ALPHA = 0.05


@dataclass(frozen=True)
class Estimate:
    """One arm's point estimate with its interval; fields are None when there is no data."""

    value: float | None
    low: float | None
    high: float | None
    n: int


@dataclass(frozen=True)
class Comparison:
    """Variant minus control: difference, its interval, two-sided p-value, chance to beat."""

    diff: float | None
    low: float | None
    high: float | None
    p_value: float | None
    chance_to_beat: float | None


NO_COMPARISON = Comparison(None, None, None, None, None)


def oriented(p_better: float, higher_is_better: bool) -> float:
    """``p_better`` is P(variant > control); flip it when lower values are better."""
    return float(p_better) if higher_is_better else float(1.0 - p_better)


def zero_se_comparison(diff: float, higher_is_better: bool) -> Comparison:
    """Both arms constant: the difference is known exactly."""
    if diff == 0:
        return Comparison(diff, diff, diff, 1.0, 0.5)
    return Comparison(diff, diff, diff, 0.0, oriented(1.0 if diff > 0 else 0.0, higher_is_better))


# --- experiment health ------------------------------------------------------------------------

def srm_check(observed: dict[str, int], expected_shares: dict[str, float],
              threshold: float = 0.001) -> dict[str, Any]:
    """Sample-ratio mismatch: chi-square goodness of fit of users per arm against the split.

    Arms are those of ``expected_shares`` (normalised to sum to 1; an arm missing from
    ``observed`` counts 0 users). An arm with a zero share but some users is a certain
    mismatch (chi2 inf, p 0). With no users, or fewer than two arms, chi2 and p are None.
    """
    unknown = set(observed) - set(expected_shares)
    if unknown:
        raise ValueError(f"observed arms without an expected share: {sorted(unknown)}")
    total_share = float(sum(expected_shares.values()))
    if total_share <= 0 or any(share < 0 for share in expected_shares.values()):
        raise ValueError("expected shares must be non-negative and not all zero")
    counts = {arm: int(observed.get(arm, 0)) for arm in expected_shares}
    total = sum(counts.values())
    expected = {arm: total * share / total_share for arm, share in expected_shares.items()}
    chi2, p_value = _chi2_gof(counts, expected) if total > 0 else (None, None)
    return {"chi2": chi2, "p_value": p_value, "mismatch": p_value is not None and p_value < threshold,
            "observed": counts, "expected": expected}


def _chi2_gof(counts: dict[str, int], expected: dict[str, float]) -> tuple[float | None, float | None]:
    """(chi2, p) over the arms with a positive expected count (see ``srm_check``)."""
    if any(expected[arm] == 0 and counts[arm] > 0 for arm in counts):
        return math.inf, 0.0
    arms = [arm for arm in counts if expected[arm] > 0]
    if len(arms) < 2:
        return None, None
    chi2 = sum((counts[arm] - expected[arm]) ** 2 / expected[arm] for arm in arms)
    return float(chi2), float(special.chdtrc(len(arms) - 1, chi2))  # scipy's chi-square survival function


def enough_data(n_control: int, n_variant: int, minimum: int) -> bool:
    """True when both arms have at least ``minimum`` observations."""
    return n_control >= minimum and n_variant >= minimum


# --- ratio metrics over users (delta method) --------------------------------------------------

@dataclass(frozen=True)
class RatioArm:
    """One arm's ratio metric: sum(num) / sum(den) over its users, with the delta-method variance.

    ``users``: the arm's units (every user in it, with or without data for this metric);
    ``users_with_data``: those with a positive denominator; ``total``: the sum of denominators
    (thumbs, ratings, answers, ...). ``value``/``variance`` are None without data.
    """

    value: float | None
    variance: float | None
    users: int
    users_with_data: int
    total: float


def ratio_arm(num: Sequence[float] | np.ndarray, den: Sequence[float] | np.ndarray) -> RatioArm:
    """Ratio of sums over users with the delta-method variance of the ratio.

    With per-user sums N_i and D_i over n users, R = sum N / sum D and
    Var(R) = (s_N^2 - 2 R s_ND + R^2 s_D^2) / (n * mean(D)^2), the sample moments with n - 1
    (GrowthBook's ``RatioStatistic``). Users count however many observations they made, so a
    heavy user weighs by their data but their observations are not independent trials.
    """
    n_arr, d_arr = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if n_arr.shape != d_arr.shape:
        raise ValueError("numerators and denominators must have one entry per user")
    n = int(d_arr.size)
    total = float(d_arr.sum())
    with_data = int(np.count_nonzero(d_arr > 0))
    if n == 0 or total <= 0:
        return RatioArm(None, None, n, with_data, total)
    ratio = float(n_arr.sum()) / total
    if n < 2:
        return RatioArm(ratio, None, n, with_data, total)
    dn, dd = n_arr - n_arr.mean(), d_arr - d_arr.mean()  # sample (co)variances, n - 1
    s_nn, s_nd, s_dd = (float(np.dot(x, y)) / (n - 1) for x, y in ((dn, dn), (dn, dd), (dd, dd)))
    mean_d = total / n
    var = (s_nn - 2 * ratio * s_nd + ratio**2 * s_dd) / (n * mean_d**2)
    return RatioArm(ratio, float(max(var, 0.0)), n, with_data, total)


def ratio_estimate(arm: RatioArm, alpha: float = ALPHA, bounds: tuple[float, float] | None = None) -> Estimate:
    """The arm's value with its normal (delta-method) interval, clipped to ``bounds`` if given."""
    if arm.value is None:
        return Estimate(None, None, None, arm.users_with_data)
    if arm.variance is None:
        return Estimate(arm.value, None, None, arm.users_with_data)
    half = float(special.ndtri(1 - alpha / 2)) * math.sqrt(arm.variance)
    low, high = arm.value - half, arm.value + half
    if bounds is not None:
        low, high = max(bounds[0], low), min(bounds[1], high)
    return Estimate(arm.value, low, high, arm.users_with_data)


# --- always-valid inference: asymptotic confidence sequences ----------------------------------

# GrowthBook's default sequentialTuningParameter: the sample size at which the sequence is tightest.
SEQUENTIAL_TUNING = 5000.0


@dataclass(frozen=True)
class Sequential:
    """An asymptotic confidence sequence for a difference and its always-valid p-value.

    ``n``: the users it is indexed by; ``tuning``: GrowthBook's sequential tuning parameter.
    """

    low: float | None
    high: float | None
    p_value: float | None
    n: int
    tuning: float


_NO_SEQUENTIAL = Sequential(None, None, None, 0, SEQUENTIAL_TUNING)


def sequential_rho(alpha: float, tuning: float = SEQUENTIAL_TUNING) -> float:
    """rho of the Gaussian mixture that makes the two-sided sequence tightest at n = ``tuning``
    (Waudby-Smith et al. 2023; GrowthBook's ``sequential_rho``)."""
    if not 0 < alpha < 1 or tuning <= 0:
        raise ValueError("need 0 < alpha < 1 and a positive tuning parameter")
    a = -2 * math.log(alpha)
    return math.sqrt((a + math.log(a + 1)) / tuning)


def cs_halfwidth(se: float, n: float, alpha: float = ALPHA, tuning: float = SEQUENTIAL_TUNING) -> float:
    """Half-width of the two-sided asymptotic confidence sequence at ``n`` users.

    With the per-user variance s^2 = n * se^2 (``se``: the estimate's standard error),
    half-width = s * sqrt(2 (n rho^2 + 1) / (n rho)^2 * log(sqrt(n rho^2 + 1) / alpha)).
    """
    if n <= 0:
        raise ValueError("a confidence sequence needs at least one user")
    rho2 = sequential_rho(alpha, tuning) ** 2
    s2 = se**2 * n
    return math.sqrt(s2 * 2 * (n * rho2 + 1) / (n**2 * rho2) * math.log(math.sqrt(n * rho2 + 1) / alpha))


def always_valid_p(diff: float, se: float, n: int, alpha: float = ALPHA, tuning: float = SEQUENTIAL_TUNING) -> float:
    """Always-valid p-value of "difference = 0": 1 / the mixture martingale (an e-value), at most 1.

    Equation 155 of Waudby-Smith et al. (arXiv 2103.06476v7), as GrowthBook writes it: with
    S^2 = n diff^2 / se^2, e = exp(rho^2 S^2 / (2 (n rho^2 + 1))) / sqrt(n rho^2 + 1). It is
    below ``alpha`` exactly when the sequence at ``alpha`` excludes 0.
    """
    if se <= 0:
        return 1.0 if diff == 0 else 0.0
    rho2 = sequential_rho(alpha, tuning) ** 2
    st2 = n * diff**2 / se**2
    log_e = rho2 * st2 / (2 * (n * rho2 + 1)) - 0.5 * math.log(n * rho2 + 1)
    return float(min(1.0, math.exp(-log_e)))


def _sequential(diff: float, se: float, n: int, alpha: float, tuning: float) -> Sequential:
    half = cs_halfwidth(se, n, alpha, tuning)
    return Sequential(diff - half, diff + half, always_valid_p(diff, se, n, alpha, tuning), n, tuning)


def _fixed(diff: float, se: float, higher_is_better: bool, alpha: float) -> Comparison:
    """Fixed-horizon normal interval and p-value for ``diff`` with standard error ``se``."""
    if se <= 0:
        return zero_se_comparison(diff, higher_is_better)
    half = float(special.ndtri(1 - alpha / 2)) * se
    z = diff / se
    return Comparison(diff, diff - half, diff + half, float(2 * special.ndtr(-abs(z))),
                      oriented(float(special.ndtr(z)), higher_is_better))


def compare_ratio_arms(control: RatioArm, variant: RatioArm, higher_is_better: bool = True, alpha: float = ALPHA,
                       tuning: float = SEQUENTIAL_TUNING) -> tuple[Comparison, Sequential]:
    """Variant minus control for two independent ratio arms.

    Fixed horizon (for reference: valid for one look only): normal interval, two-sided p-value
    and the normal-approximation chance to beat. Sequential: the confidence sequence indexed by
    all users of both arms with s^2 = n * (Var_c + Var_v), the variance of the difference of
    means' influence function per user (GrowthBook's ``SequentialTwoSidedTTest``, absolute).
    All None when an arm has no variance estimate.
    """
    if control.variance is None or variant.variance is None:
        return NO_COMPARISON, _NO_SEQUENTIAL
    diff = variant.value - control.value
    se = math.sqrt(control.variance + variant.variance)
    n = control.users + variant.users
    return _fixed(diff, se, higher_is_better, alpha), _sequential(diff, se, n, alpha, tuning)


def compare_ratio_to(arm: RatioArm, null: float, higher_is_better: bool = True, alpha: float = ALPHA,
                     tuning: float = SEQUENTIAL_TUNING) -> tuple[Comparison, Sequential]:
    """One ratio against a fixed value (the compare win rate against 1/2), as above."""
    if arm.variance is None:
        return NO_COMPARISON, _NO_SEQUENTIAL
    diff = arm.value - null
    se = math.sqrt(arm.variance)
    return _fixed(diff, se, higher_is_better, alpha), _sequential(diff, se, arm.users, alpha, tuning)


# --- power of the sequential test -------------------------------------------------------------

def sequential_mde(se: float, n: float, alpha: float = ALPHA, tuning: float = SEQUENTIAL_TUNING,
                   power: float = 0.8) -> float:
    """Smallest true difference the sequence excludes 0 for with probability ``power`` at ``n``.

    Approximation: the estimate is normal with standard error ``se``, and a look at n users
    detects d when d - halfwidth > z_power * se, so MDE = halfwidth + z_power * se (the other
    side and earlier looks are ignored, which can only add detections: conservative).
    """
    return cs_halfwidth(se, n, alpha, tuning) + float(special.ndtri(power)) * se


def users_needed(se: float, n: int, effect: float, alpha: float = ALPHA, tuning: float = SEQUENTIAL_TUNING,
                 power: float = 0.8, most: float = 1e9) -> int | None:
    """Users (both arms together) at which ``sequential_mde`` falls to ``effect``, with the
    per-user variance n * se^2 of now; ``n`` when already there, None beyond ``most`` users."""
    if effect <= 0 or n <= 0:
        raise ValueError("need a positive effect and at least one user")
    s2 = se**2 * n

    def gap(log_m: float) -> float:
        m = math.exp(log_m)
        return sequential_mde(math.sqrt(s2 / m), m, alpha, tuning, power) - effect

    if gap(math.log(n)) <= 0:
        return n
    if gap(math.log(most)) > 0:
        return None
    return int(math.ceil(math.exp(optimize.brentq(gap, math.log(n), math.log(most), xtol=1e-6))))
