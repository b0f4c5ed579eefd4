"""The policy-training algorithms, one module each, behind one registry.

Each module defines ``ALGORITHM``, an :class:`~rlhf.policy.algorithms.base.Algorithm`: its settings'
rules, how it is sized to the data, what a run of it costs, the curves its trainer logs, and
``train(job)``. The names in ``rlhf.algorithms.ALGORITHMS`` are the registry's lines (that tuple
stays torch-free for the settings' choices); adding an algorithm is a module here plus its name
there (docs/development.md, "Adding a policy algorithm").
"""
from __future__ import annotations

import importlib
from dataclasses import replace

from rlhf.algorithms import ALGORITHMS
from rlhf.data.stage_sizing import DataSize, NotEnoughData
from rlhf.policy.algorithms.base import Algorithm, Chart, PolicyJob
from rlhf.settings import CycleSettings, PolicySettings, RewardSettings

REGISTRY: dict[str, Algorithm] = {name: importlib.import_module(f"{__name__}.{name}").ALGORITHM for name in ALGORITHMS}


def algorithm(name: str) -> Algorithm:
    """The registered algorithm called ``name`` (ValueError naming the choices otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy algorithm {name!r} (choose from {', '.join(REGISTRY)})") from None


def check_settings(settings: CycleSettings) -> CycleSettings:
    """``settings`` checked field by field and by its algorithm's own rules (ValueError otherwise)."""
    settings.validate()
    algorithm(settings.algorithm).check(settings.policy)
    return settings


def size_stages(name: str, reward: RewardSettings, policy: PolicySettings, size: DataSize,
                min_pairs: int, min_prompts: int, processes: int = 1
                ) -> tuple[RewardSettings, PolicySettings, list[str]]:
    """The reward and policy settings fitted to ``size`` and the notes saying what changed. Raises
    NotEnoughData (one line, with the numbers) when a stage cannot train on it. ``processes``: how
    many train together (rlhf.training.distributed); batch sizes are per process."""
    algo = algorithm(name)
    pairs = algo.training_pairs(size)
    if pairs < min_pairs:
        raise NotEnoughData(f"not enough feedback yet: {pairs} preference pairs for training, "
                            f"need at least {min_pairs} ({algo.pairs_from})")
    if size.distinct_prompts < min_prompts:
        raise NotEnoughData(f"not enough feedback yet: {size.distinct_prompts} distinct user prompts, "
                            f"need at least {min_prompts}")
    notes: list[str] = []
    reward_pairs = size.train_pairs + size.rated_train
    if reward_pairs < reward.batch_size:
        notes.append(f"reward model: batch size {reward.batch_size} -> {reward_pairs} ({reward_pairs} training pairs)")
        reward = replace(reward, batch_size=reward_pairs)
    policy, policy_notes = algo.fit(policy, size, processes)
    return reward, policy, notes + policy_notes


__all__ = ["ALGORITHMS", "REGISTRY", "Algorithm", "Chart", "NotEnoughData", "PolicyJob", "algorithm",
           "check_settings", "size_stages"]
