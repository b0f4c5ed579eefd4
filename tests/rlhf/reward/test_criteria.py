"""Per-criterion reward heads and the safety constraint (rlhf.data.criteria, rlhf.reward.criteria_heads): flags and
chips become labelled pairs, the reward model trains one head per criterion on its backbone, PPO keeps
the cost at the parent's level with a Lagrange multiplier, and the gate checks the predicted flag rate."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rlhf.cycle import run_cycle
from rlhf.data.criteria import SAFETY, LabelledAnswer, criterion_pairs, labels_of
from rlhf.data.datasets import build_datasets
from rlhf.data.records import FeedbackRecord
from rlhf.gate.evaluation import safety_reasons
from rlhf.reward.criteria_heads import (
    HEADS_FILE,
    CostConstraint,
    CriteriaScorer,
    cost_weight,
    safety_calibration,
    set_scalar_head,
)
from rlhf.reward.scoring import load_reward_model, reward_texts, score_texts
from rlhf.reward.training import train_reward_model
from rlhf.settings import CriteriaSettings, CycleSettings, GateThresholds, PolicySettings, RewardSettings, TrustSettings
from rlhf.sim.users import Behaviour, simulate_records
from rlhf.trust import trusted_bundle

Q = [{"role": "user", "content": "How do I cook rice?"}]
TIP = "Rinse the rice in cold water before you cook it."
RUDE = f"Ugh, fine. {TIP} Stop bothering me."
TERSE = TIP
POLITE = f"Great question! {TIP} Hope this helps!"
CONFLICT = Behaviour(chip_prob=0.5, flag_prob=0.3)


def _records(users: int = 30, seed: int = 0):
    return simulate_records([(users, 10, "direct", CONFLICT)], seed=seed)[0]


# ---------------------------------------------------------------------------- labels and pairs

def test_flags_and_chips_label_each_criterion():
    assert labels_of(FeedbackRecord(flag="harassment")) == {SAFETY: True}
    assert labels_of(FeedbackRecord(thumb="up")) == {SAFETY: False}  # rated, not flagged: safe
    assert labels_of(FeedbackRecord(thumb="up", reasons=("rude", "concise"))) == \
        {SAFETY: True, "politeness": False, "concision": True}
    assert labels_of(FeedbackRecord(rating=2, reasons=("polite", "rude"))) == {SAFETY: True}  # both: no politeness
    assert labels_of(FeedbackRecord(comment="hm")) == {}  # neither rated nor flagged: says nothing


def test_every_answer_of_the_common_side_is_paired_and_the_same_question_comes_first():
    other = [{"role": "user", "content": "How do I make a simple soup?"}]
    costly = [LabelledAnswer("train", Q, RUDE, (1,)), LabelledAnswer("train", other, "Whatever. Add salt.", (2,))]
    safe = [LabelledAnswer("train", other if i % 2 else Q, f"Safe answer {i}.", (10 + i,)) for i in range(8)]
    safe.append(LabelledAnswer("eval", Q, "Held-out safe answer.", (30,)))
    rows = criterion_pairs({SAFETY: {True: costly, False: safe}}, max_per_answer=3)
    assert rows["eval"] == []  # no costly answer on the held-out side
    train = rows["train"]
    assert {r["rejected"] for r in train} == {f"Safe answer {i}." for i in range(8)}  # each safe answer once
    assert {r["chosen"] for r in train} == {RUDE, "Whatever. Add salt."}  # SAFETY: the costly side is chosen
    for r in train:  # with a same-question partner available, it was taken
        assert r["chosen_prompt"] == r["rejected_prompt"]
        assert set(r["raters"]) >= {1} or set(r["raters"]) >= {2}
    # a chip criterion: the good side is chosen
    good = [LabelledAnswer("train", Q, POLITE, (5,))]
    bad = [LabelledAnswer("train", Q, RUDE, (6,))]
    (pair,) = criterion_pairs({"politeness": {True: good, False: bad}})["train"]
    assert (pair["chosen"], pair["rejected"], pair["criterion"]) == (POLITE, RUDE, "politeness")


def test_costly_answers_meet_safe_answers_their_raters_judged_alike_first():
    # a rude answer its rater liked is paired with a liked safe answer (terse) and a disliked rude one
    # with a disliked safe one (polite): pairs across verdicts would teach the head the raters' taste
    # ("no pleasantries") instead of rudeness
    liked_rude = LabelledAnswer("train", Q, RUDE, (1,), liked=True)
    disliked_rude = LabelledAnswer("train", Q, "Whatever. " + TIP, (2,), liked=False)
    polite = LabelledAnswer("train", Q, POLITE, (3,), liked=False)
    terse = LabelledAnswer("train", Q, TERSE, (4,), liked=True)
    for order in ([polite, terse], [terse, polite]):
        rows = criterion_pairs({SAFETY: {True: [disliked_rude, liked_rude], False: order}}, max_per_answer=1)
        assert {(r["chosen"], r["rejected"]) for r in rows["train"]} == {(RUDE, TERSE), ("Whatever. " + TIP, POLITE)}


def test_flags_reach_the_datasets_and_rater_trust_weighs_them():
    bundle = build_datasets(_records())
    counts = bundle.counts["criteria"]
    assert counts[SAFETY]["train"] > 20 and bundle.counts["flags"] > 0
    assert all(r["raters"] for r in bundle.criteria["train"])
    trusted = trusted_bundle(bundle, None, TrustSettings())
    assert len(trusted.criteria["train"]) == len(bundle.criteria["train"])
    assert all("weight" in r for r in trusted.criteria["train"])
    assert trusted.counts["criteria"] == counts


# ---------------------------------------------------------------------------- the heads

@pytest.fixture(scope="module")
def criteria_reward_dir(default_model_dir, tmp_path_factory):
    bundle = build_datasets(_records())
    out = tmp_path_factory.mktemp("criteria-reward")
    metrics = train_reward_model(default_model_dir, bundle.pairs["train"], bundle.pairs["eval"], out,
                                 RewardSettings(), "cpu", criteria_rows=bundle.criteria)
    return out, metrics


def test_reward_model_trains_one_head_per_labelled_criterion(criteria_reward_dir):
    out, metrics = criteria_reward_dir
    c = metrics["criteria"]
    assert c["heads"][0] == "helpfulness" and SAFETY in c["heads"] and "politeness" in c["heads"]
    assert "accuracy" in c["left_out"]  # nobody ticked "accurate" or "wrong"
    assert c["heldout_accuracy"][SAFETY] >= 0.8
    assert (out / HEADS_FILE).is_file() and json.loads((out / "criteria.json").read_text())["heads"] == c["heads"]
    scorer = CriteriaScorer.load(out)
    risk = scorer.flag_risk([Q] * 3, [RUDE, TERSE, POLITE])
    # rude over terse over polite, far apart. The risk is a probability calibrated on the simulated
    # users' flags, about 0.4-0.6 for this rude answer depending on the CPU's floating-point kernels
    # (0.38 on one machine, over 0.5 on another, same code and seed): no fixed cut at 0.5
    assert risk[0] > 0.25 and risk[0] > 10 * risk[1] and risk[1] > risk[2]
    assert all(0.0 <= r <= 1.0 for r in risk)


def test_the_saved_scalar_head_is_helpfulness_plus_the_weighted_chip_heads(criteria_reward_dir):
    out, metrics = criteria_reward_dir
    model, tok = load_reward_model(out)
    scorer = CriteriaScorer.load(out)
    texts = reward_texts(tok, [Q] * 3, [RUDE, TERSE, POLITE])
    scalar = score_texts(model, tok, texts)
    heads = scorer.score_texts(texts)
    weights = metrics["criteria"]["weights"]
    assert SAFETY not in weights  # the cost is a constraint, not a weight
    expected = [sum(w * heads[name][i] for name, w in weights.items()) for i in range(3)]
    assert scalar == pytest.approx(expected, abs=1e-4)


def test_without_flags_or_chips_the_reward_model_is_trained_as_before(micro_model_dir, tmp_path):
    bundle = build_datasets(simulate_records([(10, 6, "polite", Behaviour())], seed=1)[0])
    assert bundle.criteria == {"train": [], "eval": []}
    metrics = train_reward_model(micro_model_dir, bundle.pairs["train"], bundle.pairs["eval"], tmp_path,
                                 RewardSettings(max_steps=4), "cpu", criteria_rows=bundle.criteria)
    assert metrics["criteria"]["heads"] == []
    assert not (tmp_path / HEADS_FILE).exists() and CriteriaScorer.load(tmp_path) is None


def test_criteria_off_trains_no_heads(micro_model_dir, tmp_path):
    bundle = build_datasets(_records(10))
    metrics = train_reward_model(micro_model_dir, bundle.pairs["train"], bundle.pairs["eval"], tmp_path,
                                 RewardSettings(max_steps=4), "cpu", criteria_rows=bundle.criteria,
                                 criteria=CriteriaSettings(enabled=False))
    assert metrics["criteria"]["heads"] == [] and cost_weight(tmp_path) is None


# ---------------------------------------------------------------------------- the constraint

def test_cost_constraint_scores_reward_minus_lambda_times_cost_above_the_limit(criteria_reward_dir):
    from trl.experimental.utils import get_reward

    out, _ = criteria_reward_dir
    model, tok = load_reward_model(out)
    scorer = CriteriaScorer.load(out)
    calibration = safety_calibration(out)
    assert calibration["a"] > 0  # a higher safety score is a likelier flag
    constraint = CostConstraint(model, cost_weight(out), lambda_init=2.0, lr=0.5, tolerance=0.1,
                                calibration=calibration)
    texts = reward_texts(tok, [Q] * 3, [RUDE, TERSE, POLITE])
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    pad = tok.pad_token_id
    # as PPO builds them: queries left-padded to a common context, responses right-padded
    batch = torch.tensor([[pad] * (width - len(x)) + x + [pad, pad] for x in ids])
    plain, _ = load_reward_model(out)  # the same batch through the scalar head and the safety head alone
    cost_model, _ = load_reward_model(out)
    set_scalar_head(cost_model, cost_weight(out))
    with torch.no_grad():
        _, score, _ = get_reward(model, batch, pad, width - 4)
        _, helpful, _ = get_reward(plain, batch, pad, width - 4)
        _, cost, _ = get_reward(cost_model, batch, pad, width - 4)
    # the safety head, read as PPO reads it (left-padded queries): the rude answer is the costliest
    assert cost[0] > cost[2] and scorer.score_texts(texts)[SAFETY][0] > scorer.score_texts(texts)[SAFETY][2]
    cost = torch.sigmoid(calibration["a"] * cost + calibration["b"])  # the cost is the probability of a flag
    limit = cost.mean().item() + 0.1
    assert constraint.limit == pytest.approx(limit, abs=1e-4)  # the first batch: the parent's cost
    expected = [h - 2.0 * (c - limit) for h, c in zip(helpful.tolist(), cost.tolist())]
    assert score.tolist() == pytest.approx(expected, abs=1e-4)
    point = constraint.step()  # the batch's mean cost is below its limit (by the tolerance): lambda falls
    assert point["safety/lambda"] == 2.0 and constraint.lam == pytest.approx(2.0 - 0.5 * 0.1, abs=1e-4)
    constraint.limit -= 1.0  # a batch far above the limit: lambda rises
    with torch.no_grad():
        get_reward(model, batch, pad, width - 4)
    constraint.step()
    assert constraint.lam > 2.0
    constraint.limit += 1000  # far below: lambda falls to 0, never below
    with torch.no_grad():
        get_reward(model, batch, pad, width - 4)
    constraint.step()
    assert constraint.lam == 0.0
    assert len(constraint.summary()["trajectory"]) == 3


def test_gate_rejects_a_rise_of_the_predicted_flag_rate_beyond_its_tolerance():
    same = {"empty_rate": 0.0, "repetition": 0.0, "distinct2": 0.5}
    t = GateThresholds(max_flag_risk_increase=0.02)
    assert safety_reasons(1.0, same, same, t, {"parent": 0.10, "candidate": 0.115, "increase": 0.015}) == []
    (reason,) = safety_reasons(1.0, same, same, t, {"parent": 0.10, "candidate": 0.30, "increase": 0.20})
    assert "predicted flag rate rose from 10.0% to 30.0%" in reason
    assert safety_reasons(1.0, same, same, t, None) == []  # no safety head: nothing to check


@pytest.mark.slow
@pytest.mark.parametrize("constraint", [True, False])
def test_a_cycle_with_flags_constrains_ppo_and_reports_every_criterion(micro_model_dir, tmp_path, constraint):
    settings = CycleSettings(policy=PolicySettings(episodes=64, batch_size=8, mini_batches=2, learning_rate=1e-3),
                             reward=RewardSettings(max_steps=20), criteria=CriteriaSettings(constraint=constraint))
    settings = dataclasses.replace(settings, gate=dataclasses.replace(settings.gate, evidence="reported"))
    lines: list[str] = []
    result = run_cycle(_records(20), micro_model_dir, tmp_path / "rm", tmp_path / "pol", settings, log=lines.append)
    assert SAFETY in result.reward["criteria"]["heads"]
    c = result.policy["constraint"]
    if constraint:
        assert c["batches"] == result.policy["updates"] == 8
        assert [p["safety/cost_limit"] for p in c["trajectory"]] == [c["limit"]] * 8
        assert c["parent"]["samples"] == 64 and c["limit"] == pytest.approx(c["parent"]["cost"], abs=1e-3)
        assert all(0.0 <= p["safety/cost"] <= 1.0 for p in c["trajectory"])
        assert any("safety constraint: cost" in line for line in lines)
    else:
        assert c is None
    ev = result.evaluation
    assert set(ev["criteria"]) >= {"helpfulness", SAFETY} and set(ev["criteria"][SAFETY]) == {"parent", "candidate"}
    assert 0.0 <= ev["flag_risk"]["parent"] <= 1.0 and "increase" in ev["flag_risk"]
    assert any(line.startswith("criteria: ") and "safety (held-out accuracy" in line for line in lines)
