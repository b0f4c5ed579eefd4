"""The cycle's data stage runs once: ``prepare_cycle`` builds, weighs and sizes the data, and
``run_prepared`` trains on that outcome as it is (the trainers stubbed here: no model is trained)."""
from __future__ import annotations

import pytest

import rlhf.cycle
import rlhf.policy.ppo
from rlhf.cycle import PreparedData, prepare_cycle, run_prepared
from rlhf.settings import CycleSettings
from rlhf.sim.users import Behaviour, simulate_records
from rlhf.trust import RaterInfo


@pytest.fixture
def prepared() -> PreparedData:
    records, _ = simulate_records([(6, 4, "polite", Behaviour())], seed=5)
    return prepare_cycle(records, CycleSettings(min_pairs=1, min_prompts=1), {1: RaterInfo(1, trust="quarantined")})


def test_prepare_cycle_weighs_and_sizes_the_data(prepared):
    assert prepared.bundle.counts["trust"]["raters"]["1"]["status"] == "quarantined"
    assert prepared.notes, "the default batch sizes are larger than this data: sizing says what it changed"
    assert prepared.settings.policy.batch_size <= len(prepared.bundle.prompts["train"])
    assert prepared.settings.policy.batch_size < CycleSettings().policy.batch_size
    assert prepared.seconds > 0


def test_run_prepared_trains_on_the_prepared_data_without_preparing_again(prepared, tmp_path, monkeypatch):
    def again(*args, **kwargs):
        raise AssertionError("the data stage ran again")

    for name in ("build_datasets", "weigh_raters", "trusted_bundle", "fit_to_data", "size_stages", "prepare_cycle"):
        monkeypatch.setattr(rlhf.cycle, name, again)
    seen = {}

    def reward(parent, train, held_out, out_dir, settings, *args, **kwargs):
        seen["reward"] = (train, settings)
        return {"heldout_accuracy": 1.0, "train_accuracy": 1.0, "train_pairs": len(train), "rated_pairs": 0,
                "criteria": {"heads": ["reward"], "heldout_accuracy": {}}}

    def ppo(parent, reward_dir, prompts, out_dir, settings, *args, **kwargs):
        seen["policy"] = settings
        return {"steps": 1}

    def judge(parent, bundle, out_dir, settings, progress=None):
        seen["judge"] = bundle
        return {"trained_on_pairs": 1, "questions": 1, "accuracy": 1.0, "accuracy_pairs": 1}

    monkeypatch.setattr(rlhf.cycle, "train_reward_model", reward)
    monkeypatch.setattr(rlhf.policy.ppo, "train_ppo", ppo)  # the PPO algorithm's trainer (loaded when it trains)
    monkeypatch.setattr(rlhf.cycle, "train_judge", judge)
    monkeypatch.setattr(rlhf.cycle, "evaluate_candidate", lambda *a, **k: {"passed": False})
    monkeypatch.setattr(rlhf.cycle, "describe", lambda evaluation: "evaluate: stubbed")
    lines: list[str] = []
    result = run_prepared(prepared, tmp_path / "parent", tmp_path / "rm", tmp_path / "policy", log=lines.append)

    assert seen["reward"] == (prepared.bundle.pairs["train"], prepared.settings.reward)
    assert seen["policy"] is prepared.settings.policy
    assert seen.get("judge", prepared.bundle) is prepared.bundle
    assert result.counts is prepared.bundle.counts
    assert result.timings["data"] == round(prepared.seconds, 2)
    # the data stage's lines, each once
    assert [line for line in lines if line.startswith("sized to the data: ")] == \
        [f"sized to the data: {note}" for note in prepared.notes]
    assert sum(line.startswith("rater trust: ") for line in lines) == 1


def test_the_judge_trains_for_its_own_minimum_of_steps(micro_model_dir, tmp_path):
    """``evaluation.judge_min_steps`` bounds the judge's steps (it trains on the held-out rows alone);
    -1 keeps the reward model's ``min_steps``."""
    from dataclasses import replace

    from rlhf.cycle import train_judge

    records, _ = simulate_records([(40, 3, "polite", Behaviour())], seed=3)
    base = prepare_cycle(records, CycleSettings(device="cpu", min_pairs=1, min_prompts=1))
    assert base.bundle.pairs["eval"], "the seed gives held-out pairs"
    settings = replace(base.settings, reward=replace(base.settings.reward, min_steps=12, epochs=0.01))
    steps = {}
    for judge_min in (-1, 3):
        judged = replace(settings, evaluation=replace(settings.evaluation, judge_min_steps=judge_min))
        steps[judge_min] = train_judge(micro_model_dir, base.bundle, tmp_path / f"judge{judge_min}", judged)["steps"]
    # min_steps rounds up to whole passes over the rows
    assert steps[-1] >= 12 and 3 <= steps[3] < 8
