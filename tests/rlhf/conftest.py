"""Fixtures of the ML layer's tests."""
from __future__ import annotations

import pytest

from rlhf.reward.training import train_reward_model
from rlhf.settings import RewardSettings
from tests.support.training import clean_pairs


@pytest.fixture(scope="session")
def reward_dir(micro_model_dir, tmp_path_factory):
    """A reward model of the micro model trained on clean helpful-over-rude pairs (read only: the
    reward, policy and gate tests share it)."""
    out = tmp_path_factory.mktemp("rm") / "reward"
    metrics = train_reward_model(micro_model_dir, clean_pairs(200, 0), clean_pairs(50, 1), out,
                                 RewardSettings(epochs=8, learning_rate=2e-3), device="cpu")
    return out, metrics
