"""The policy-training algorithms a cycle can run (rlhf.policy trains each with TRL).

A module of its own so the web app and the CLI can offer the choice without importing torch.
"""
from __future__ import annotations

ALGORITHMS: tuple[str, ...] = (
    "ppo",   # PPO against the reward model (the default)
    "dpo",   # DPO on the preference pairs
    "kto",   # KTO on thumbs up/down answers
    "rloo",  # RLOO: several samples per prompt, baseline = the others' mean reward
    "iterative_dpo",  # DPO on the parent's own answers, best over worst as the reward model ranks them
)
