"""The cycle samples answers as the server serves them (webapp.training.runner.sampled_as_served):
the gate at the server's temperature and top_p, iterative DPO at its top_p, unless the operator set
the training values."""
from __future__ import annotations

import pytest

from tests.support.app import make_app
from webapp.core.settings import ConfigError
from webapp.training.runner import cycle_settings


def test_the_gate_and_iterative_dpo_sample_as_the_server_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_TEMPERATURE", "0.3")
    monkeypatch.setenv("RLHF_TOP_P", "0.6")
    app = make_app(tmp_path / "instance")
    with app.app_context():
        settings = cycle_settings()
    assert (settings.evaluation.temperature, settings.evaluation.top_p) == (0.3, 0.6)
    # iterative DPO keeps its own temperature (PPO's: near-greedy samples would rarely differ enough to rank)
    assert (settings.policy.temperature, settings.policy.top_p) == (0.8, 0.6)

    monkeypatch.setenv("RLHF_TRAINING_EVALUATION_TOP_P", "0.9")
    monkeypatch.setenv("RLHF_TRAINING_EVALUATION_TEMPERATURE", "1.1")
    monkeypatch.setenv("RLHF_TRAINING_POLICY_TOP_P", "1.0")
    chosen = make_app(tmp_path / "instance")
    with chosen.app_context():
        settings = cycle_settings()
    assert (settings.evaluation.temperature, settings.evaluation.top_p, settings.policy.top_p) == (1.1, 0.9, 1.0)


def test_a_training_top_p_outside_its_range_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_TRAINING_POLICY_TOP_P", "0")
    with pytest.raises(ConfigError, match=r"RLHF_TRAINING_POLICY_TOP_P='0' \(environment\) must be > 0"):
        make_app(tmp_path / "instance")
