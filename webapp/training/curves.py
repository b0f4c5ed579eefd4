"""A training run's curves for the run page and the admin API: which metrics each algorithm's
charts show, the series read from the run's curves file (rlhf.training.curves) (drawn by
webapp.admin.charts.curve_figures, and redrawn by static/js/admin.js while a run trains)."""
from __future__ import annotations

from typing import Any

from rlhf.policy.algorithms import REGISTRY
from rlhf.training.curves import read_curves, series
from webapp.core.models import TrainingRun
from webapp.training.runs import curves_path


def _chart(stage: str, title: str, metrics: list[str], labels: list[str] | None = None,
           percent: bool = False, optional: bool = False) -> dict[str, Any]:
    """``optional``: drawn only for runs that log its metrics (a finished run without them has none)."""
    return {"id": f"{stage}:{metrics[0]}", "stage": stage, "title": title, "metrics": metrics,
            "labels": labels or [""] * len(metrics), "percent": percent, "optional": optional}


# TRL's own metric names (trl 1.12): the RewardTrainer's here, each policy trainer's with its algorithm.
REWARD_CHARTS = [
    _chart("reward", "Loss", ["loss"]),
    _chart("reward", "Pairwise accuracy", ["accuracy"], percent=True),
    _chart("reward", "Margin (chosen − rejected reward)", ["margin"]),
]
POLICY_CHARTS: dict[str, list[dict[str, Any]]] = {
    name: [_chart("policy", c.title, list(c.metrics), list(c.labels) or None, c.percent, c.optional)
           for c in algo.charts]
    for name, algo in REGISTRY.items()  # each algorithm's own (rlhf.policy.algorithms)
}
STAGE_TITLES = {"reward": "Reward model"}


def policy_title(algorithm_name: str | None) -> str:
    """The run page's title of the policy stage ("Policy (PPO)")."""
    algo = REGISTRY.get(algorithm_name or "ppo")
    return f"Policy ({algo.title if algo else (algorithm_name or '').upper()})"


def charts_for(algorithm: str | None) -> list[dict[str, Any]]:
    return REWARD_CHARTS + POLICY_CHARTS.get(algorithm or "ppo", POLICY_CHARTS["ppo"])


def run_curves(run: TrainingRun) -> dict[str, Any]:
    """The curves API answer: ``series`` ({stage: {metric: [{step, value}]}}) and the ``charts``
    the run page draws from them."""
    data = series(read_curves(curves_path(run.id)))
    logged = {metric for metrics in data.values() for metric in metrics}
    live = run.status in ("queued", "running")
    charts = [c for c in charts_for(run.algorithm) if not c["optional"] or live or set(c["metrics"]) & logged]
    return {"run_id": run.id, "algorithm": run.algorithm, "status": run.status, "live": live, "series": data,
            "charts": charts}


