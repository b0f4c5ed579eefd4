"""The names of the policy-training algorithms a cycle can run: the registry's lines.

Each name is a module of rlhf.policy.algorithms that defines the algorithm (its settings' rules,
sizing, cost, curves and trainer). The tuple lives apart, importing nothing, so the settings can
offer the choice without importing the algorithms.
"""
from __future__ import annotations

ALGORITHMS: tuple[str, ...] = (
    "ppo",   # PPO against the reward model (the default)
    "dpo",   # DPO on the preference pairs
    "kto",   # KTO on thumbs up/down answers
    "rloo",  # RLOO: several samples per prompt, baseline = the others' mean reward
    "iterative_dpo",  # DPO on the parent's own answers, best over worst as the reward model ranks them
)
