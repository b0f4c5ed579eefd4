"""Policy training: PPO, RLOO, DPO, iterative DPO and KTO through TRL, against the reward model.

``algorithms`` is the registry the cycle trains through (one record per algorithm); the trainers'
entry points are importable from here too, loaded on first use so that asking the registry about
an algorithm never loads torch or TRL. ``common`` holds what the trainers share.
"""
from __future__ import annotations

import importlib
from typing import Any

_TRAINERS = {"reward_ranked_pairs": "offline", "train_dpo": "offline", "train_iterative_dpo": "offline",
             "train_kto": "offline", "train_ppo": "ppo", "train_rloo": "rloo"}


def __getattr__(name: str) -> Any:
    if name in _TRAINERS:
        return getattr(importlib.import_module(f"{__name__}.{_TRAINERS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_TRAINERS)
