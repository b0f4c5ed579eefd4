"""RLOO: several answers sampled per prompt, each one's baseline the mean reward of the others
(TRL's RLOOTrainer, the reward model as its reward function: rlhf.policy.rloo)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlhf.data.stage_sizing import DataSize
from rlhf.policy.algorithms.base import Algorithm, Chart, PolicyJob
from rlhf.settings import PolicySettings


class RLOO(Algorithm):
    name, title = "rloo", "RLOO"
    charts = (
        Chart("Reward (reward model)", ("reward",)),
        Chart("KL from the reference", ("kl",)),
        Chart("Entropy", ("entropy",)),
        Chart("Loss", ("loss",)),
        Chart("Clip ratio", ("clip_ratio/region_mean",), percent=True),
    )

    def fit(self, policy: PolicySettings, size: DataSize, processes: int = 1) -> tuple[PolicySettings, list[str]]:
        self.need_prompts(size, "RLOO")
        groups = max(1, policy.batch_size // policy.rloo_generations)  # distinct prompts per batch
        if size.policy_prompts >= groups and policy.batch_size % policy.rloo_generations == 0:
            return policy, []
        fitted = min(groups, size.policy_prompts) * policy.rloo_generations  # whole groups of generations
        note = (f"RLOO: batch size {policy.batch_size} -> {fitted} ({size.policy_prompts} training prompts x "
                f"{policy.rloo_generations} generations)")
        return replace(policy, batch_size=fitted, episodes=max(policy.episodes, fitted)), [note]

    def train(self, job: PolicyJob) -> dict[str, Any]:
        from rlhf.policy.rloo import train_rloo

        return train_rloo(job.parent_dir, job.reward_dir, job.prompts, job.out_dir, job.settings.policy,
                          job.settings.device, job.progress, job.logs)


ALGORITHM = RLOO()
