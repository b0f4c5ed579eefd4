"""The promotion policy: what to do with a running experiment, given its metrics table.

Pure function of the table (:func:`webapp.experiments.table.metrics_table`, which
``metrics.experiment_metrics`` returns) so it can be tested on constructed tables and driven
by simulations. It decides on the *sequential* intervals (asymptotic confidence sequences over
users, see docs/experiments.md, "How verdicts are computed"), which stay valid however often the
monitor looks; the fixed-horizon p-values in the table are for reference only:

* promote -- the primary metric has enough users with data in both arms and its sequential
             interval lies entirely on the better side, and every guardrail (thumbs, rating,
             compare votes, flagged rate) that has data clears: it has enough users and its sequential
             interval rules out a loss of a typical effect (5 points, a quarter star) -- a
             sequential non-inferiority test (a guardrail without any data is none);
* retire  -- the primary metric's sequential interval lies entirely on the worse side, or a
             guardrail's does (a harm is proven, whatever the primary says), or the maximum
             duration has passed without a result (keep the control);
* wait    -- otherwise. A sample-ratio mismatch also means wait: the numbers are not trusted.

The guardrail rule only ever withholds a promotion, so it cannot raise the false-promotion rate
the primary metric's sequence guarantees; it keeps a variant that is better on the primary
metric but worse on what users say from being promoted while that harm is still too small to be
significant (benchmarks/ab_validity.py, guardrail scenario). It is always-valid too: the
sequence covers the true difference at every look with probability at least 1 - alpha, so a
guardrail that is truly worse by a typical effect or more clears at *any* look with probability
at most ``guardrail_alpha`` (1 %, stricter than the primary metric's 5 %: a harm slipping through
is worse than a gain found late), however often the monitor looks. A guardrail whose estimate
merely looks no worse at one look does not clear: with that weaker rule a true loss between one
and two typical effects slips through at some look (1.8 % of the guardrail scenario's variants at
tuning 500).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from webapp.experiments.sequential_tests import cs_halfwidth


@dataclass(frozen=True)
class PromotionPolicy:
    """The policy's settings: RLHF_PRIMARY_METRIC, RLHF_PROMOTE_ALPHA, RLHF_EXPERIMENT_MAX_HOURS,
    RLHF_SEQUENTIAL_TUNING, RLHF_AB_USER_CAP and RLHF_GUARDRAIL_ALPHA; the power and typical effects are reporting
    choices, not settings."""

    primary_metric: str = "thumbs_up_rate"
    alpha: float = 0.05
    max_hours: float = 72.0
    # GrowthBook's sequentialTuningParameter: the number of users (both arms) at which the
    # confidence sequence is tightest; it stays valid at any other size, only wider. 500, near the
    # size experiments here reach, rather than GrowthBook's 5000 (stats.SEQUENTIAL_TUNING).
    sequential_tuning: float = 500.0
    # the most observations one user's data counts as in a metric (RLHF_AB_USER_CAP; 0: no cap)
    user_cap: float = 1.0
    # level of the guardrails' non-inferiority sequences (RLHF_GUARDRAIL_ALPHA): a guardrail truly
    # worse by a typical effect clears at any look with probability at most this
    guardrail_alpha: float = 0.01
    # power reported for the primary metric, and the "typical effect" it is computed for
    power: float = 0.8
    typical_effect_rate: float = 0.05  # rates and the compare win rate: 5 points
    typical_effect_rating: float = 0.25  # mean rating: a quarter star
    typical_effect_sd: float = 0.2  # other means: this share of the per-user standard deviation

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be between 0 and 1, got {self.alpha}")
        if not 0 < self.guardrail_alpha < 1:
            raise ValueError(f"guardrail_alpha must be between 0 and 1, got {self.guardrail_alpha}")
        if self.user_cap < 0:
            raise ValueError(f"the user cap must be >= 0 (0: no cap), got {self.user_cap}")
        if self.sequential_tuning <= 0 or not 0 < self.power < 1:
            raise ValueError("the sequential tuning parameter must be positive and power between 0 and 1")


def policy_from_config(config: Mapping[str, Any]) -> PromotionPolicy:
    """The policy of an app's settings (checked at start-up; the fields without a setting keep
    their defaults)."""
    return PromotionPolicy(primary_metric=str(config["RLHF_PRIMARY_METRIC"]), alpha=float(config["RLHF_PROMOTE_ALPHA"]),
                           max_hours=float(config["RLHF_EXPERIMENT_MAX_HOURS"]),
                           sequential_tuning=float(config.get("RLHF_SEQUENTIAL_TUNING", 500.0)),
                           user_cap=float(config.get("RLHF_AB_USER_CAP", 1.0)),
                           guardrail_alpha=float(config.get("RLHF_GUARDRAIL_ALPHA", 0.01)))


@dataclass(frozen=True)
class Decision:
    action: str  # promote / retire / wait
    reason: str
    numbers: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What users say directly: a variant that is significantly worse on any of these is never promoted,
# whatever the primary metric (e.g. a reward-model score the variant was optimised against) says.
# The flagged rate is lower-is-better (metric_catalog): "worse" is more answers flagged as harmful.
GUARDRAILS = ("thumbs_up_rate", "mean_rating", "compare_win_rate", "flagged_rate")


def verdict(row: dict[str, Any]) -> str | None:
    """"better", "worse" or None: where the row's sequential interval lies, oriented so that
    "better" is good for the variant (lower latency, higher thumbs-up rate, ...)."""
    seq = row.get("sequential") or {}
    low, high = seq.get("low"), seq.get("high")
    if not row.get("enough_data") or low is None or high is None:
        return None
    if low > 0:
        return "better" if row["higher_is_better"] else "worse"
    if high < 0:
        return "worse" if row["higher_is_better"] else "better"
    return None


def _oriented(value: float, row: dict[str, Any]) -> float:
    """``value`` (a difference) with its sign flipped when lower is better: > 0 is good."""
    return value if row["higher_is_better"] else -value


def unsafe(row: dict[str, Any], policy: PromotionPolicy) -> bool:
    """A guardrail with enough data that is not cleared for a promotion: its sequential interval
    at ``policy.guardrail_alpha`` does not rule out a loss of a typical effect
    (``policy.typical_effect_*``). A sequential non-inferiority test with margin = that effect:
    valid at every look, with an error rate of at most ``guardrail_alpha``."""
    seq = row.get("sequential") or {}
    if not row.get("enough_data") or seq.get("low") is None or not seq.get("n"):
        # a guardrail users have started to give data on is not cleared before it can be judged
        # (thumbs come before stars: the primary metric could otherwise be promoted on while the
        # rating is still unmeasured); one nobody uses (no data in either arm) is no guardrail
        return bool((row["control"].get("n") or 0) + (row["variant"].get("n") or 0))
    margin = policy.typical_effect_rating if row["name"] == "mean_rating" else policy.typical_effect_rate
    # the row's sequence is at policy.alpha; its half-width scales with the level as the boundary does
    tuning = seq.get("tuning") or policy.sequential_tuning
    half = (seq["high"] - seq["low"]) / 2 * cs_halfwidth(1.0, seq["n"], policy.guardrail_alpha, tuning) / \
        cs_halfwidth(1.0, seq["n"], policy.alpha, tuning)
    worst = _oriented((seq["high"] + seq["low"]) / 2, row) - half
    return worst <= -margin


def _numbers(row: dict[str, Any], metrics: dict[str, Any], hours_running: float) -> dict[str, Any]:
    c, seq = row.get("comparison") or {}, row.get("sequential") or {}
    power = row.get("power") or {}
    return {"metric": row["name"], "control": row["control"].get("value"), "variant": row["variant"].get("value"),
            "n_control": row["control"].get("n"), "n_variant": row["variant"].get("n"), "diff": c.get("diff"),
            "sequential_ci": [seq.get("low"), seq.get("high")], "p_value": seq.get("p_value"),
            "fixed_horizon_ci": [c.get("low"), c.get("high")], "fixed_horizon_p_value": c.get("p_value"),
            "chance_to_beat": c.get("chance_to_beat"), "mde": power.get("mde"),
            "more_users": power.get("more_users"), "hours_running": round(hours_running, 3),
            "srm_p_value": (metrics.get("srm") or {}).get("p_value")}


def _waiting(row: dict[str, Any], min_sample: int | None) -> str:
    """Why the policy waits, in words: too little data, or how far from a verdict."""
    if not row.get("enough_data"):
        need = f" (need {min_sample} users with data per arm)" if min_sample else ""
        return f"not enough data yet: {row['control'].get('n')} / {row['variant'].get('n')} users{need}"
    seq, power = row.get("sequential") or {}, row.get("power") or {}
    if seq.get("p_value") is None:
        return "no variance yet"
    text = f"not significant yet (always-valid p={seq['p_value']:.3g})"
    if power.get("mde") is not None:
        text += f"; detectable now: {power['mde']:.3g}"
    effect = power.get("typical_effect")
    if effect and power.get("more_users"):
        days = power.get("days_more")
        text += f"; {effect:+.3g} needs ~{power['more_users']:,} more users" + \
            (f" (~{days:.1f} days)" if days is not None else "")
    elif effect and power.get("mde") is not None and power.get("users_needed") is None:
        text += f"; {effect:+.3g} would need more than a billion users (never)"
    return text


def decide(metrics: dict[str, Any], settings: PromotionPolicy, hours_running: float) -> Decision:
    """promote / retire / wait for an experiment's metrics table after ``hours_running`` hours."""
    rows = {m["name"]: m for m in metrics["metrics"]}
    if settings.primary_metric not in rows:
        raise ValueError(f"unknown primary metric {settings.primary_metric!r} (choose from {', '.join(rows)})")
    row = rows[settings.primary_metric]
    numbers = _numbers(row, metrics, hours_running)
    timed_out = hours_running >= settings.max_hours
    if (metrics.get("srm") or {}).get("mismatch"):
        if timed_out:
            return Decision("retire", "maximum duration reached with a sample ratio mismatch", numbers)
        return Decision("wait", "sample ratio mismatch: routing must be fixed before deciding", numbers)
    primary = verdict(row)
    p = numbers["p_value"]
    guards = [rows[g] for g in GUARDRAILS if g in rows and g != row["name"]]
    worse = [g["name"] for g in guards if verdict(g) == "worse"]
    if primary == "worse":
        return Decision("retire", f"variant worse on {row['name']} (always-valid p={p:.4g} < {settings.alpha})",
                        numbers)
    if worse:
        numbers["guardrails_worse"] = worse
        better = f"better on {row['name']} but " if primary == "better" else ""
        return Decision("retire", f"variant {better}significantly worse on {', '.join(worse)}", numbers)
    unsafe_guards = [g["name"] for g in guards if unsafe(g, settings)]
    if primary == "better" and not unsafe_guards:
        return Decision("promote", f"variant better on {row['name']} (always-valid p={p:.4g} < {settings.alpha})",
                        numbers)
    if timed_out:
        if primary == "better":
            return Decision("retire", f"maximum duration reached: variant better on {row['name']}, but a loss on "
                                      f"{', '.join(unsafe_guards)} is not ruled out", numbers)
        return Decision("retire", f"no significant result on {row['name']} after {settings.max_hours} h", numbers)
    if primary == "better":
        numbers["guardrails_unsafe"] = unsafe_guards
        return Decision("wait", f"variant better on {row['name']}, but a loss of a typical effect on "
                                f"{', '.join(unsafe_guards)} is not ruled out yet", numbers)
    return Decision("wait", _waiting(row, metrics.get("min_sample")), numbers)
