"""DPO on the preference pairs the reward model sees (TRL's DPOTrainer: rlhf.policy.offline)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlhf.data.stage_sizing import DataSize
from rlhf.policy.algorithms.base import Algorithm, Chart, PolicyJob
from rlhf.settings import PolicySettings

# TRL's DPOTrainer logs (iterative DPO's too)
DPO_CHARTS = (
    Chart("Loss", ("loss",)),
    Chart("Rewards: chosen and rejected", ("rewards/chosen", "rewards/rejected"), ("chosen", "rejected")),
    Chart("Reward margin", ("rewards/margins",)),
    Chart("Reward accuracy", ("rewards/accuracies",), percent=True),
)


def offline_units(rows: int, policy: PolicySettings) -> float:
    return rows * policy.passes(rows)


class DPO(Algorithm):
    name, title = "dpo", "DPO"
    pairs_from = "corrections, compare votes, or differing ratings on answers to the same question"
    charts = DPO_CHARTS

    def training_pairs(self, size: DataSize) -> int:
        return size.train_pairs  # DPO's pairs answer one question; rated pairs across questions cannot train it

    def fit(self, policy: PolicySettings, size: DataSize, processes: int = 1) -> tuple[PolicySettings, list[str]]:
        if size.train_pairs >= policy.batch_size:
            return policy, []
        return (replace(policy, batch_size=size.train_pairs),
                [f"DPO: batch size {policy.batch_size} -> {size.train_pairs} ({size.train_pairs} pairs)"])

    def work_units(self, policy: PolicySettings, size: DataSize) -> float:
        return offline_units(size.train_pairs, policy)

    def train(self, job: PolicyJob) -> dict[str, Any]:
        from rlhf.policy.offline import train_dpo

        return train_dpo(job.parent_dir, job.bundle.pairs["train"], job.out_dir, job.settings.policy,
                         job.settings.device, job.progress, job.logs)


ALGORITHM = DPO()
