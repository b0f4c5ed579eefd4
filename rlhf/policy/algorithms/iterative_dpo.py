"""Iterative DPO: the parent samples answers to the training prompts, the reward model ranks them,
DPO trains on best over worst (rlhf.policy.offline.train_iterative_dpo)."""
from __future__ import annotations

from typing import Any

from rlhf.data.stage_sizing import DataSize
from rlhf.policy.algorithms.base import Algorithm, PolicyJob
from rlhf.policy.algorithms.dpo import DPO_CHARTS, offline_units
from rlhf.settings import PolicySettings


class IterativeDPO(Algorithm):
    name, title = "iterative_dpo", "Iterative DPO"
    charts = DPO_CHARTS  # DPO on the parent's own answers

    def fit(self, policy: PolicySettings, size: DataSize, processes: int = 1) -> tuple[PolicySettings, list[str]]:
        self.need_prompts(size, "iterative DPO")
        return policy, []  # the DPO batch is fitted to the pairs once they are sampled

    def work_units(self, policy: PolicySettings, size: DataSize) -> float:
        # answers sampled per prompt, then DPO on the pairs
        prompts = min(size.policy_prompts, policy.max_prompts or size.policy_prompts)
        return prompts * policy.samples_per_prompt + offline_units(prompts * policy.pairs_per_prompt, policy)

    def train(self, job: PolicyJob) -> dict[str, Any]:
        from rlhf.policy.offline import train_iterative_dpo

        return train_iterative_dpo(job.parent_dir, job.reward_dir, job.prompts, job.out_dir, job.settings.policy,
                                   job.settings.device, job.progress, job.logs)


ALGORITHM = IterativeDPO()
