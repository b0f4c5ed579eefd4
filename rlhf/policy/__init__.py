"""Policy training: PPO, RLOO, DPO, iterative DPO and KTO through TRL, against the reward model."""
