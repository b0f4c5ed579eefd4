"""The A/B metrics the app measures, defined once.

Each: name, label, kind, higher is better (False: lower is better, e.g. the correction, regenerate
and flagged rates, latency), and the per-user columns (webapp.experiments.table) whose ratio it
is. The experiment metrics compute them, the promotion policy decides on one of them, and the
settings check ``primary_metric`` against their names.
"""
from __future__ import annotations

# name, label, kind, higher_is_better, numerator column, denominator column
METRICS: tuple[tuple[str, str, str, bool, str, str], ...] = (
    ("thumbs_up_rate", "Thumbs-up rate", "proportion", True, "ups", "thumbs"),
    ("mean_rating", "Mean rating (1-5)", "mean", True, "rating_sum", "ratings"),
    ("correction_rate", "Correction rate", "proportion", False, "corrections", "answers"),
    ("regenerate_rate", "Regenerate rate", "proportion", False, "regenerations", "answers"),
    ("flagged_rate", "Flagged rate (answers flagged as harmful)", "proportion", False, "flags", "answers"),
    ("compare_win_rate", "Compare win rate (variant vs control)", "win_rate", True, "wins", "decisive"),
    ("mean_reward", "Mean reward-model score", "mean", True, "reward_sum", "scored"),
    # the safety head of the same reward model (rlhf.reward.criteria_heads): what users would flag
    ("mean_cost", "Mean safety cost (safety head)", "mean", False, "cost_sum", "cost_scored"),
    ("latency_ms", "Latency (ms)", "mean", False, "latency_sum", "timed"),
)

METRIC_NAMES: tuple[str, ...] = tuple(m[0] for m in METRICS)
