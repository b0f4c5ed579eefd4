"""The A/B metrics the app measures, defined once: (name, label, kind, higher is better).

The experiment metrics compute them, the promotion policy decides on one of them, and the
settings check ``primary_metric`` against their names.
"""
from __future__ import annotations

METRICS: tuple[tuple[str, str, str, bool], ...] = (
    ("thumbs_up_rate", "Thumbs-up rate", "proportion", True),
    ("mean_rating", "Mean rating (1-5)", "mean", True),
    ("correction_rate", "Correction rate", "proportion", False),
    ("regenerate_rate", "Regenerate rate", "proportion", False),
    ("compare_win_rate", "Compare win rate (variant vs control)", "win_rate", True),
    ("mean_reward", "Mean reward-model score", "mean", True),
    ("latency_ms", "Latency (ms)", "mean", False),
)

METRIC_NAMES: tuple[str, ...] = tuple(m[0] for m in METRICS)
