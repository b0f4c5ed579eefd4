"""A training run's curves for the run page and the admin API: which metrics each algorithm's
charts show, the series read from the run's curves file (rlhf.training.curves) (drawn by
webapp.admin.charts.curve_figures, and redrawn by static/js/admin.js while a run trains)."""
from __future__ import annotations

from typing import Any

from rlhf.training.curves import read_curves, series

from webapp.core.models import TrainingRun
from webapp.training.runs import curves_path


def _chart(stage: str, title: str, metrics: list[str], labels: list[str] | None = None,
           percent: bool = False, optional: bool = False) -> dict[str, Any]:
    """``optional``: drawn only for runs that log its metrics (a finished run without them has none)."""
    return {"id": f"{stage}:{metrics[0]}", "stage": stage, "title": title, "metrics": metrics,
            "labels": labels or [""] * len(metrics), "percent": percent, "optional": optional}


# TRL's own metric names (trl 1.12): RewardTrainer, experimental PPOTrainer, DPO/KTO/RLOO trainers.
REWARD_CHARTS = [
    _chart("reward", "Loss", ["loss"]),
    _chart("reward", "Pairwise accuracy", ["accuracy"], percent=True),
    _chart("reward", "Margin (chosen − rejected reward)", ["margin"]),
]
POLICY_CHARTS: dict[str, list[dict[str, Any]]] = {
    "ppo": [
        _chart("policy", "Score (reward model)", ["objective/scores"]),
        _chart("policy", "RLHF reward (score − KL penalty)", ["objective/rlhf_reward"]),
        _chart("policy", "KL from the reference", ["objective/kl"]),
        _chart("policy", "Entropy", ["objective/entropy"]),
        _chart("policy", "Policy loss", ["loss/policy_avg"]),
        _chart("policy", "Value loss", ["loss/value_avg"]),
        _chart("policy", "Clip fraction", ["policy/clipfrac_avg"], percent=True),
        # the safety constraint (rlhf.reward.criteria_heads.CostConstraint), when the reward model has a safety head
        _chart("policy", "Safety cost and its limit (the parent's)", ["safety/cost", "safety/cost_limit"],
               ["mean cost", "limit"], optional=True),
        _chart("policy", "Lagrange multiplier of the cost", ["safety/lambda"], optional=True),
    ],
    "dpo": [
        _chart("policy", "Loss", ["loss"]),
        _chart("policy", "Rewards: chosen and rejected", ["rewards/chosen", "rewards/rejected"], ["chosen", "rejected"]),
        _chart("policy", "Reward margin", ["rewards/margins"]),
        _chart("policy", "Reward accuracy", ["rewards/accuracies"], percent=True),
    ],
    "kto": [
        _chart("policy", "Loss", ["loss"]),
        _chart("policy", "Rewards: desirable and undesirable", ["rewards/chosen", "rewards/rejected"],
               ["desirable", "undesirable"]),
        _chart("policy", "Reward margin", ["rewards/margins"]),
        _chart("policy", "KL estimate", ["kl"]),
    ],
    "rloo": [
        _chart("policy", "Reward (reward model)", ["reward"]),
        _chart("policy", "KL from the reference", ["kl"]),
        _chart("policy", "Entropy", ["entropy"]),
        _chart("policy", "Loss", ["loss"]),
        _chart("policy", "Clip ratio", ["clip_ratio/region_mean"], percent=True),
    ],
}
POLICY_CHARTS["iterative_dpo"] = POLICY_CHARTS["dpo"]  # DPO on the parent's own answers, ranked by the reward model
STAGE_TITLES = {"reward": "Reward model"}


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


