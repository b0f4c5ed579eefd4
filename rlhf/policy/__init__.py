"""Policy training: PPO, RLOO, DPO, iterative DPO and KTO through TRL, against the reward model.

The trainers' public entry points are re-exported here; ``common`` holds what they share.
"""
from rlhf.policy.offline import reward_ranked_pairs, train_dpo, train_iterative_dpo, train_kto
from rlhf.policy.ppo import train_ppo
from rlhf.policy.rloo import train_rloo

__all__ = ["reward_ranked_pairs", "train_dpo", "train_iterative_dpo", "train_kto", "train_ppo", "train_rloo"]
