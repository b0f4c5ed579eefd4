"""PPO against the reward model (the default): TRL's experimental PPOTrainer, the value model
initialised from the reward model, the safety constraint on its cost (rlhf.policy.ppo)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlhf.data.stage_sizing import DataSize, NotEnoughData
from rlhf.policy.algorithms.base import Algorithm, Chart, PolicyJob
from rlhf.settings import PolicySettings


class PPO(Algorithm):
    name, title = "ppo", "PPO"
    charts = (
        Chart("Score (reward model)", ("objective/scores",)),
        Chart("RLHF reward (score − KL penalty)", ("objective/rlhf_reward",)),
        Chart("KL from the reference", ("objective/kl",)),
        Chart("Entropy", ("objective/entropy",)),
        Chart("Policy loss", ("loss/policy_avg",)),
        Chart("Value loss", ("loss/value_avg",)),
        Chart("Clip fraction", ("policy/clipfrac_avg",), percent=True),
        # the safety constraint (rlhf.reward.criteria_heads.CostConstraint), when the reward model has a safety head
        Chart("Safety cost and its limit (the parent's)", ("safety/cost", "safety/cost_limit"),
              ("mean cost", "limit"), optional=True),
        Chart("Lagrange multiplier of the cost", ("safety/lambda",), optional=True),
    )

    def check(self, policy: PolicySettings) -> None:
        # a rollout batch splits into equal mini-batches, and the episodes fill at least one batch
        if policy.batch_size % policy.mini_batches:
            raise ValueError("PPO: batch_size must be a multiple of mini_batches "
                             f"(batch_size={policy.batch_size}, mini_batches={policy.mini_batches})")
        if policy.episodes < policy.batch_size:
            raise ValueError(f"PPO: episodes must be >= batch_size (episodes={policy.episodes}, "
                             f"batch_size={policy.batch_size})")

    def fit(self, policy: PolicySettings, size: DataSize, processes: int = 1) -> tuple[PolicySettings, list[str]]:
        # TRL's PPO drops incomplete batches and repeats its loader `while True`: fewer prompts than
        # a batch would spin forever without a step, so the batch fits each process's share of them
        need = policy.mini_batches * processes
        if size.policy_prompts < need:
            raise NotEnoughData(f"not enough feedback yet: {size.policy_prompts} training prompts, PPO needs at "
                                f"least {need} (one per mini-batch" + (f" on each of {processes} processes"
                                                                      if processes > 1 else "")
                                + ") to fill a rollout batch")
        share = size.policy_prompts // processes
        batch = min(policy.batch_size, share)
        batch -= batch % policy.mini_batches
        if batch == policy.batch_size:
            return policy, []
        note = (f"PPO: batch size {policy.batch_size} -> {batch} ({size.policy_prompts} training prompts, "
                + (f"{share} per process, " if processes > 1 else "") + f"{policy.mini_batches} mini-batches)")
        return replace(policy, batch_size=batch, episodes=max(policy.episodes, batch)), [note]

    def train(self, job: PolicyJob) -> dict[str, Any]:
        from rlhf.policy.ppo import train_ppo

        return train_ppo(job.parent_dir, job.reward_dir, job.prompts, job.out_dir, job.settings.policy,
                         job.settings.device, job.progress, job.logs, criteria=job.settings.criteria)


ALGORITHM = PPO()
