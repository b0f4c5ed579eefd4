"""The promotion policy: what to do with a running experiment, given its metrics.

Pure function of the metrics dict (``ab_metrics.experiment_metrics``) so it can be tested on
constructed tables:
* promote  -- the primary metric has enough samples in both arms and the variant is better
              with p < alpha, and no guardrail metric (thumbs, rating, compare votes) is
              significantly worse;
* retire   -- enough samples and the variant is worse with p < alpha, or the maximum duration
              has passed without a significant result (keep the control);
* wait     -- otherwise. A sample-ratio mismatch also means wait: the numbers are not trusted.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class PromotionPolicy:
    primary_metric: str = "thumbs_up_rate"
    alpha: float = 0.05
    max_hours: float = 72.0


@dataclass(frozen=True)
class Decision:
    action: str  # promote / retire / wait
    reason: str
    numbers: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What users say directly: a variant that is significantly worse on any of these is never promoted,
# whatever the primary metric (e.g. a reward-model score the variant was optimised against) says.
GUARDRAILS = ("thumbs_up_rate", "mean_rating", "compare_win_rate")


def _better(row: dict[str, Any]) -> bool:
    diff = row["comparison"]["diff"]
    return diff > 0 if row["kind"] == "win_rate" else (diff > 0) == row["higher_is_better"]


def decide(metrics: dict[str, Any], settings: PromotionPolicy, hours_running: float) -> Decision:
    rows = {m["name"]: m for m in metrics["metrics"]}
    if settings.primary_metric not in rows:
        raise ValueError(f"unknown primary metric {settings.primary_metric!r} (choose from {', '.join(rows)})")
    row = rows[settings.primary_metric]
    c = row["comparison"]
    numbers = {"metric": row["name"], "control": row["control"].get("value"), "variant": row["variant"].get("value"),
               "n_control": row["control"].get("n"), "n_variant": row["variant"].get("n"), "diff": c.get("diff"),
               "ci": [c.get("low"), c.get("high")], "p_value": c.get("p_value"),
               "chance_to_beat": c.get("chance_to_beat"), "hours_running": round(hours_running, 3),
               "srm_p_value": metrics.get("srm", {}).get("p_value")}
    timed_out = hours_running >= settings.max_hours
    if metrics.get("srm", {}).get("mismatch"):
        if timed_out:
            return Decision("retire", "maximum duration reached with a sample ratio mismatch", numbers)
        return Decision("wait", "sample ratio mismatch: routing must be fixed before deciding", numbers)
    significant = row["enough_data"] and c.get("p_value") is not None and c["p_value"] < settings.alpha
    if significant and c.get("diff") is not None and c["diff"] != 0:
        better = _better(row)
        worse_guard = [g["name"] for g in rows.values() if g["name"] in GUARDRAILS and g is not row and
                       g["enough_data"] and (g["comparison"].get("p_value") or 1) < settings.alpha and
                       g["comparison"].get("diff") and not _better(g)]
        if better and worse_guard:
            numbers["guardrails_worse"] = worse_guard
            return Decision("retire", f"variant better on {row['name']} but significantly worse on "
                                      f"{', '.join(worse_guard)}", numbers)
        if better:
            return Decision("promote", f"variant better on {row['name']} (p={c['p_value']:.4g} < {settings.alpha})",
                            numbers)
        return Decision("retire", f"variant worse on {row['name']} (p={c['p_value']:.4g} < {settings.alpha})", numbers)
    if timed_out:
        return Decision("retire", f"no significant result on {row['name']} after {settings.max_hours} h", numbers)
    why = "not enough data yet" if not row["enough_data"] else f"not significant yet (p={c.get('p_value')})"
    return Decision("wait", why, numbers)
