"""The metrics table of an experiment from per-user rows: pure, no Flask, no database.

Users are the unit of analysis (they are what is randomized): each user's answers, thumbs,
ratings, corrections, regenerations, flags and compare votes are summed first, one row per user, each
user's sums are scaled to weigh at most ``policy.user_cap`` observations (by default one: a user
counts once however much they rate), and every metric is a ratio of sums over users with its
delta-method variance (:func:`webapp.experiments.sequential_tests.ratio_arm`).
``webapp.experiments.metrics`` builds the rows from the database; ``benchmarks/ab_validity.py``
feeds simulated ones. Both get the same table, which the promotion policy
(:mod:`webapp.experiments.promotion`) decides on.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from webapp.core.metric_catalog import METRICS
from webapp.experiments import sequential_tests as ab_stats
from webapp.experiments.promotion import PromotionPolicy

ARMS = ("control", "variant")
ARM_CODES = {"control": 0, "variant": 1}  # -1: a user in no arm (a compare voter never assigned)

# Per-user sums, one column each.
FIELDS = ("answers", "thumbs", "ups", "ratings", "rating_sum", "corrections", "regenerations", "flags", "scored",
          "reward_sum", "cost_scored", "cost_sum", "timed", "latency_sum", "wins", "losses", "ties")

UserTable = dict[str, np.ndarray]


def user_table(rows: Iterable[Mapping[str, Any]]) -> UserTable:
    """Columns from one mapping per user: ``arm`` ("control", "variant" or None) and any of
    :data:`FIELDS` (missing ones are 0)."""
    rows = list(rows)
    table = {"arm": np.array([ARM_CODES.get(r.get("arm"), -1) for r in rows], dtype=np.int8)}
    for field in FIELDS:
        table[field] = np.array([float(r.get(field, 0) or 0) for r in rows], dtype=float)
    return table


def capped(num: np.ndarray, den: np.ndarray, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """Each user's numerator and denominator scaled so the denominator is at most ``cap``
    (0: unchanged). A user's rate is kept; only their weight in the arm's ratio is bounded, so
    one person who rates a hundred answers (or a script) counts as ``cap`` observations. With
    cap 1 the ratio is the mean over users of each user's own rate."""
    if cap <= 0:
        return num, den
    scale = np.minimum(1.0, cap / np.maximum(den, 1e-12))
    return num * scale, den * scale


def _column(users: UserTable, name: str) -> np.ndarray:
    if name == "decisive":
        return users["wins"] + users["losses"]
    return users[name]


def typical_effect(kind: str, name: str, policy: PromotionPolicy, unit_sd: float | None) -> float | None:
    """The effect the power estimate is for: points for rates, stars for the rating, else a
    share (``policy.typical_effect_sd``) of the per-user standard deviation."""
    if kind in ("proportion", "win_rate"):
        return policy.typical_effect_rate
    if name == "mean_rating":
        return policy.typical_effect_rating
    return policy.typical_effect_sd * unit_sd if unit_sd else None


def power_estimate(se: float, n: int, effect: float | None, policy: PromotionPolicy,
                   users_per_day: float | None) -> dict[str, Any]:
    """The sequential test's MDE now and how many more users ``effect`` needs (and days, at
    ``users_per_day``). ``users_needed`` None: more than a billion users, in practice never."""
    out: dict[str, Any] = {"alpha": policy.alpha, "power": policy.power, "users": n,
                           "mde": ab_stats.sequential_mde(se, n, policy.alpha, policy.sequential_tuning, policy.power),
                           "typical_effect": effect, "users_needed": None, "more_users": None, "days_more": None,
                           "users_per_day": users_per_day}
    if effect:
        needed = ab_stats.users_needed(se, n, effect, policy.alpha, policy.sequential_tuning, policy.power)
        out["users_needed"] = needed
        if needed is not None:
            out["more_users"] = max(0, needed - n)
            if users_per_day:
                out["days_more"] = out["more_users"] / users_per_day
    out["summary"] = power_summary(out)
    return out


def power_summary(pw: dict[str, Any]) -> str:
    """The power estimate in words (ab-report and the experiment page show it)."""
    text = (f"with {pw['users']:,} users the sequential test detects a difference of {pw['mde']:.3g} "
            f"with {pw['power']:.0%} power (alpha {pw['alpha']:g})")
    effect = pw.get("typical_effect")
    if not effect:
        return text
    if pw["users_needed"] is None:
        return text + f"; {effect:+.3g} would take more than a billion users: in practice never"
    if pw["more_users"] == 0:
        return text + f"; enough users for {effect:+.3g}"
    text += f"; {effect:+.3g} needs about {pw['users_needed']:,} users ({pw['more_users']:,} more"
    if pw.get("days_more") is None:
        return text + "; no arrival rate yet to say how long)"
    return text + f", about {pw['days_more']:.1f} days at {pw['users_per_day']:.0f} new users a day)"


def _fields(obj: Any) -> dict[str, Any]:
    """A flat dataclass's fields as a dict (``dataclasses.asdict`` without its deep copy)."""
    return dict(vars(obj))


def _estimate(arm: ab_stats.RatioArm, kind: str, alpha: float, observations: float) -> dict[str, Any]:
    bounds = (0.0, 1.0) if kind in ("proportion", "win_rate") else None
    return _fields(ab_stats.ratio_estimate(arm, alpha, bounds)) | {"users": arm.users, "observations": observations}


def _flip(est: dict[str, Any]) -> dict[str, Any]:
    """The control's share of decisive votes: 1 - the variant's."""
    if est["value"] is None:
        return dict(est)
    flipped = {"value": 1 - est["value"], "low": None if est["high"] is None else 1 - est["high"],
               "high": None if est["low"] is None else 1 - est["low"]}
    return est | flipped


def metric_row(users: UserTable, spec: tuple[str, str, str, bool, str, str], min_sample: int,
               policy: PromotionPolicy, users_per_day: float | None = None,
               masks: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """One metric: per-arm estimates, the difference (fixed horizon and sequential), and for the
    policy's primary metric the power of the sequential test. ``masks``: each arm's users."""
    name, label, kind, higher, num_col, den_col = spec
    masks = masks or (users["arm"] == 0, users["arm"] == 1)
    raw_den = _column(users, den_col)
    num, den = capped(_column(users, num_col), raw_den, policy.user_cap)
    row: dict[str, Any] = {"name": name, "label": label, "kind": kind, "higher_is_better": higher}
    if kind == "win_rate":  # each user votes on pairs of both arms: one sample of users against 1/2
        pooled = ab_stats.ratio_arm(num, den)
        comparison, sequential = ab_stats.compare_ratio_to(pooled, 0.5, higher, policy.alpha,
                                                           policy.sequential_tuning)
        variant = _estimate(pooled, kind, policy.alpha, float(raw_den.sum()))
        row.update(control=_flip(variant), variant=variant, enough_data=pooled.users_with_data >= min_sample,
                   votes={"variant_wins": int(users["wins"].sum()), "control_wins": int(users["losses"].sum()),
                          "ties": int(users["ties"].sum())})
        arms = [pooled]
    else:
        arms = [ab_stats.ratio_arm(num[mask], den[mask]) for mask in masks]
        comparison, sequential = ab_stats.compare_ratio_arms(arms[0], arms[1], higher, policy.alpha,
                                                             policy.sequential_tuning)
        row.update(control=_estimate(arms[0], kind, policy.alpha, float(raw_den[masks[0]].sum())),
                   variant=_estimate(arms[1], kind, policy.alpha, float(raw_den[masks[1]].sum())),
                   enough_data=ab_stats.enough_data(arms[0].users_with_data, arms[1].users_with_data, min_sample))
    row.update(comparison=_fields(comparison), sequential=_fields(sequential), power=None)
    if name == policy.primary_metric and sequential.n and comparison.diff is not None:
        se = math.sqrt(sum(a.variance for a in arms))
        unit_sd = math.sqrt(sum(a.variance * a.users for a in arms) / len(arms))
        if se > 0:
            row["power"] = power_estimate(se, sequential.n, typical_effect(kind, name, policy, unit_sd), policy,
                                          users_per_day)
    return row


def metrics_table(users: UserTable, split: float, min_sample: int, policy: PromotionPolicy,
                  users_per_day: float | None = None) -> dict[str, Any]:
    """The table the dashboard, the admin API, ``ab-report`` and the promotion policy share.

    ``users``: one row per user (see :func:`user_table`); ``split``: the variant's share of
    users; ``min_sample``: users with data per arm before a metric is judged.
    """
    masks = (users["arm"] == 0, users["arm"] == 1)
    observed = {arm: int(np.count_nonzero(masks[code])) for arm, code in ARM_CODES.items()}
    arms = {arm: {"users": observed[arm], "answers": int(users["answers"][masks[code]].sum())}
            for arm, code in ARM_CODES.items()}
    return {
        "min_sample": min_sample,
        "policy": {"primary_metric": policy.primary_metric, "alpha": policy.alpha,
                   "sequential_tuning": policy.sequential_tuning, "power": policy.power, "user_cap": policy.user_cap},
        "arms": arms,
        "srm": ab_stats.srm_check(observed, {"control": 1 - split, "variant": split}),
        "metrics": [metric_row(users, spec, min_sample, policy, users_per_day, masks) for spec in METRICS],
    }
