"""One record per policy algorithm (rlhf.policy.algorithms): its settings' rules, its sizing, its
cost and its curves; the cycle, the settings, the watchdog and the run page ask the registry and
name no algorithm themselves (no model is trained here)."""
from __future__ import annotations

import importlib
import re
from dataclasses import replace

import pytest

import rlhf.cycle
from rlhf.algorithms import ALGORITHMS
from rlhf.cycle import prepare_cycle, run_prepared
from rlhf.data.stage_sizing import DataSize, NotEnoughData
from rlhf.policy.algorithms import REGISTRY, Algorithm, PolicyJob, algorithm, check_settings, size_stages
from rlhf.settings import CycleSettings, PolicySettings, RewardSettings
from rlhf.sim.users import Behaviour, simulate_records
from tests.support.paths import ROOT


def size(pairs: int = 20, prompts: int = 10, good: int = 5, bad: int = 5, rated: int = 0) -> DataSize:
    return DataSize(train_pairs=pairs, eval_pairs=4, rated_train=rated, policy_prompts=prompts,
                    distinct_prompts=prompts, kto_good=good, kto_bad=bad)


def test_every_registered_name_is_a_module_defining_its_algorithm():
    assert tuple(REGISTRY) == ALGORITHMS
    for name in ALGORITHMS:
        module = importlib.import_module(f"rlhf.policy.algorithms.{name}")
        record = module.ALGORITHM
        assert isinstance(record, Algorithm) and record is REGISTRY[name] and record.name == name
        assert record.title and record.charts and all(c.metrics for c in record.charts)
        assert type(record).train is not Algorithm.train, f"{name} has no trainer"
    with pytest.raises(ValueError, match="unknown policy algorithm 'sgd' \\(choose from ppo, dpo"):
        algorithm("sgd")


def test_ppo_mini_batch_rule_is_ppo_s_alone():
    """The rule once applied to all five algorithms and was switched off again for DPO and KTO."""
    odd = PolicySettings(batch_size=10, mini_batches=4)
    with pytest.raises(ValueError, match="PPO: batch_size must be a multiple of mini_batches"):
        check_settings(CycleSettings(policy=odd))
    with pytest.raises(ValueError, match="PPO: episodes must be >= batch_size"):
        check_settings(CycleSettings(policy=PolicySettings(batch_size=16, episodes=8)))
    for name in ALGORITHMS[1:]:
        assert check_settings(CycleSettings(algorithm=name, policy=odd)).policy is odd
    with pytest.raises(ValueError, match="learning_rate"):  # the fields' ranges hold for every algorithm
        check_settings(CycleSettings(algorithm="dpo", policy=PolicySettings(learning_rate=2.0)))


def test_each_algorithm_sizes_itself_to_the_data():
    reward = RewardSettings(batch_size=16)
    policy = PolicySettings(batch_size=16, mini_batches=4, rloo_generations=4)

    _, ppo, notes = size_stages("ppo", reward, policy, size(prompts=10), 1, 1)
    assert ppo.batch_size == 8 and ppo.batch_size % ppo.mini_batches == 0 and "PPO: batch size 16 -> 8" in notes[-1]
    with pytest.raises(NotEnoughData, match="3 training prompts, PPO needs at least 4"):
        size_stages("ppo", reward, policy, size(prompts=3), 1, 1)

    _, rloo, notes = size_stages("rloo", reward, policy, size(prompts=3), 1, 1)
    assert rloo.batch_size == 12 and "3 training prompts x 4 generations" in notes[-1]  # whole groups

    _, dpo, notes = size_stages("dpo", reward, policy, size(pairs=6), 1, 1)
    assert dpo.batch_size == 6 and dpo.mini_batches == 4  # PPO's mini-batches left alone: not DPO's concern
    with pytest.raises(NotEnoughData, match="0 preference pairs .* answers to the same question"):
        size_stages("dpo", reward, policy, size(pairs=0, rated=12), 8, 1)  # rated pairs cannot train DPO
    assert size_stages("ppo", reward, policy, size(pairs=0, rated=12), 8, 1)[0].batch_size == 12  # a reward model's

    _, kto, _ = size_stages("kto", reward, policy, size(good=2, bad=1), 1, 1)
    assert kto.batch_size == 3
    with pytest.raises(NotEnoughData, match="KTO needs both good and bad"):
        size_stages("kto", reward, policy, size(good=4, bad=0), 1, 1)

    for name in ("rloo", "iterative_dpo"):
        with pytest.raises(NotEnoughData, match="0 training prompts"):
            size_stages(name, reward, policy, size(prompts=0), 1, 0)


def test_work_units_follow_what_each_algorithm_trains_on():
    p = PolicySettings(episodes=512, epochs=2.0, samples_per_prompt=8, pairs_per_prompt=2)
    data = size(pairs=30, prompts=10, good=7, bad=3)
    assert algorithm("ppo").work_units(p, data) == algorithm("rloo").work_units(p, data) == 512
    assert algorithm("ppo").work_units(replace(p, max_steps=2, batch_size=16), data) == 32
    assert algorithm("dpo").work_units(p, data) == 60 and algorithm("kto").work_units(p, data) == 20
    assert algorithm("iterative_dpo").work_units(p, data) == 10 * (8 + 2 * 2.0)
    # at least min_steps steps: 30 pairs in batches of 16 are 2 steps a pass, so 5 steps take 3 passes
    assert algorithm("dpo").work_units(replace(p, min_steps=5, batch_size=16), data) == 30 * 3
    assert algorithm("dpo").work_units(replace(p, min_steps=4, batch_size=16), data) == 30 * 2.0


class Recording(Algorithm):
    """A sixth algorithm as a module would define it: what it was asked to train with is recorded."""

    name, title = "recording", "Recording"
    jobs: list[PolicyJob] = []

    def train(self, job: PolicyJob) -> dict:
        self.jobs.append(job)
        return {"algorithm": self.name, "steps": 0}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_cycle_trains_each_algorithm_through_its_record(name, monkeypatch, tmp_path):
    records, _ = simulate_records([(6, 4, "polite", Behaviour())], seed=5)
    prepared = prepare_cycle(records, CycleSettings(algorithm=name, min_pairs=1, min_prompts=1))
    recorder = Recording()
    recorder.jobs = []
    monkeypatch.setitem(REGISTRY, name, recorder)
    monkeypatch.setattr(rlhf.cycle, "train_reward_model", lambda *a, **k: {
        "heldout_accuracy": 1.0, "train_accuracy": 1.0, "train_pairs": 1, "rated_pairs": 0,
        "criteria": {"heads": ["reward"], "heldout_accuracy": {}}})
    monkeypatch.setattr(rlhf.cycle, "train_judge", lambda *a, **k: {
        "trained_on_pairs": 1, "questions": 1, "accuracy": 1.0, "accuracy_pairs": 1})
    monkeypatch.setattr(rlhf.cycle, "evaluate_candidate", lambda *a, **k: {"passed": False})
    monkeypatch.setattr(rlhf.cycle, "describe", lambda evaluation: "evaluate: stubbed")
    result = run_prepared(prepared, tmp_path / "parent", tmp_path / "rm", tmp_path / "policy")
    (job,) = recorder.jobs
    assert result.policy == {"algorithm": "recording", "steps": 0}
    assert job.settings is prepared.settings and job.bundle is prepared.bundle
    assert (job.parent_dir, job.reward_dir, job.out_dir) == (tmp_path / "parent", tmp_path / "rm", tmp_path / "policy")
    assert job.prompts == [r["prompt"] for r in prepared.bundle.prompts["train"]]


def test_no_algorithm_is_named_outside_its_record():
    """The cycle, the data stage, the settings and the web app's training feature dispatch through
    the registry: no branch on an algorithm's name, no table keyed by one (the datasets' ``kto``
    rows are a kind of data, not the algorithm)."""
    places = [ROOT / "rlhf" / "cycle.py", ROOT / "rlhf" / "settings.py", *(ROOT / "rlhf" / "data").glob("*.py"),
              *(ROOT / "webapp" / "training").glob("*.py"), ROOT / "webapp" / "admin" / "pages.py"]
    names = "|".join(ALGORITHMS)  # compared with, listed in a tuple, or keying a table of their own
    pattern = re.compile(rf"""[=!]=\s*["']({names})["']|in \(["']({names})["']|["']({names})["']:\s*\[""")
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in places
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
