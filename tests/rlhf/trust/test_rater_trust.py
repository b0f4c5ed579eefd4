"""Rater trust (rlhf.trust): attribution of every row to its raters, the volume caps, the
agreement-based reliability and quarantine on simulated feedback (rlhf.sim.users), the
guard, admin overrides, applying the weights, and the weighted reward-model loss."""
from __future__ import annotations

import zlib
from dataclasses import replace

import pytest

from rlhf.cycle import prepare_data
from rlhf.data.datasets import DataSettings, build_datasets, to_standard
from rlhf.data.records import ComparisonRecord, ConversationRecord, FeedbackRecord, MessageRecord
from rlhf.settings import CycleSettings, TrustSettings
from rlhf.sim.users import Behaviour, simulate_records
from rlhf.trust import RaterInfo, apply_trust, assess_raters, resample_by_weight, row_weight, water_fill

ALL_TRAIN = DataSettings(eval_fraction=0.0)
HONEST, CONTRARY = Behaviour(), Behaviour(contrary=True)


def simulate(groups, seed=0):
    records, label = simulate_records(groups, seed=seed)
    return build_datasets(records), label


def shares(result, label, group):
    members = [r for r in result.raters if label[r].startswith(group)]
    return (sum(result.raters[r].raw_share for r in members), sum(result.raters[r].share for r in members),
            sum(result.raters[r].status == "quarantined" for r in members), len(members))


def honest_weight_kept(result, label):
    honest = [r for r in result.raters if not label[r].startswith("contrary")]
    raw = sum(result.raters[r].raw_share for r in honest)
    return sum(result.raters[r].raw_share * result.raters[r].weight for r in honest) / raw


# ---------------------------------------------------------------------------- attribution

def conv(cid, user, answers, question="How do I cook rice?", comparisons=()):
    q = MessageRecord(cid * 100, "user", question)
    msgs = [q] + [MessageRecord(cid * 100 + i + 1, "assistant", text, q.id, fb) for i, (text, fb) in enumerate(answers)]
    return ConversationRecord(cid, tuple(msgs), tuple(comparisons), user_id=user)


def test_every_row_kind_names_its_raters():
    up, down = FeedbackRecord(thumb="up"), FeedbackRecord(thumb="down")
    records = [
        conv(1, 7, [("Rinse it first.", up), ("Ugh, whatever.", FeedbackRecord(thumb="down", correction="Rinse it."))]),
        conv(2, 8, [("A2", None), ("B2", None)], question="Vote?",
             comparisons=[ComparisonRecord(1, 200, 201, 202, "a")]),
        conv(3, 9, [("good answer", up)], question="Same question?"),
        conv(4, 10, [("bad answer", down)], question="Same question?"),
        conv(5, None, [("nobody's", up)], question="Anonymous?"),
    ]
    b = build_datasets(records, ALL_TRAIN)
    by_source = {r["source"]: r["raters"] for r in b.pairs["train"]}
    assert by_source["correction"] == (7,) and by_source["siblings"] == (7,) and by_source["compare"] == (8,)
    assert set(by_source["same_prompt"]) == {9, 10}  # two conversations, two raters
    kto = {r["completion"][0]["content"]: r["raters"] for r in b.kto["train"]}
    assert kto["Rinse it."] == kto["Ugh, whatever."] == (7,) and kto["A2"] == (8,) and kto["nobody's"] == ()
    assert all(r["raters"] == kto[r["completion"][0]["content"]] for r in b.sft["train"])
    prompts = {r["prompt"][0]["content"]: r["raters"] for r in b.prompts["train"]}
    assert prompts == {"How do I cook rice?": (7,), "Vote?": (8,), "Same question?": (9, 10), "Anonymous?": ()}


def test_a_row_several_raters_gave_identically_names_them_all():
    up = FeedbackRecord(thumb="up")
    b = build_datasets([conv(1, 1, [("Rinse it.", up)]), conv(2, 2, [("Rinse it.", up)])], ALL_TRAIN)
    [row] = b.kto["train"]
    assert row["raters"] == (1, 2) and b.counts["kto_dropped"]["duplicate"] == 1


def test_to_standard_keeps_the_weight():
    row = {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "a"}],
           "rejected": [{"role": "assistant", "content": "b"}], "margin": 1.0, "weight": 0.25, "raters": (3,)}

    class Tok:
        eos_token = "<eos>"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            text = "".join(f"{m['role']}: {m['content']}<eos>" for m in messages)
            return text + ("assistant:" if add_generation_prompt else "")

    out = to_standard(row, Tok())
    assert out["weight"] == 0.25 and out["margin"] == 1.0 and "raters" not in out


# ---------------------------------------------------------------------------- caps

def test_water_filling_caps_the_heaviest_at_max_share():
    factors = water_fill({**{r: 10.0 for r in range(20)}, 99: 100.0}, 0.1)
    masses = {r: m * factors[r] for r, m in {**{r: 10.0 for r in range(20)}, 99: 100.0}.items()}
    assert masses[99] / sum(masses.values()) == pytest.approx(0.1)
    assert all(factors[r] == 1.0 for r in range(20))
    # fewer raters than 1 / max_share: every rater counts the same
    factors = water_fill({1: 5.0, 2: 50.0, 3: 20.0}, 0.1)
    assert {round(m * factors[r], 9) for r, m in {1: 5.0, 2: 50.0, 3: 20.0}.items()} == {5.0}


def test_a_rater_with_ten_times_the_volume_ends_at_most_at_max_share():
    bundle, label = simulate([(15, 4, "polite", HONEST), (1, 40, "polite", HONEST)])
    heavy = max(label)
    settings = TrustSettings(iterations=0, max_multiple_of_median=100.0)  # the share cap alone
    result = assess_raters(bundle, None, settings)
    assert result.raters[heavy].raw_share > 0.3  # ten times the others' volume
    assert result.raters[heavy].share <= 0.1 + 1e-6 and "capped" in result.raters[heavy].reasons
    assert sum(rep.share for rep in result.raters.values()) == pytest.approx(1.0, abs=1e-4)
    # with the defaults the median rule cuts it first: to twice the median rater's rows
    result = assess_raters(bundle, None, TrustSettings(iterations=0))
    rows = sorted(rep.events for rep in result.raters.values())
    assert result.raters[heavy].weight * result.raters[heavy].events <= 2 * rows[len(rows) // 2] + 1e-6
    assert result.raters[heavy].share <= 0.1 + 1e-6


def test_with_fewer_raters_than_one_over_max_share_everybody_counts_the_same():
    bundle, _ = simulate([(4, 5, "polite", HONEST), (1, 20, "polite", HONEST)])
    result = assess_raters(bundle, None, TrustSettings(iterations=0))
    assert len(result.raters) == 5
    assert all(rep.share == pytest.approx(0.2, abs=1e-4) for rep in result.raters.values())
    assert any("fewer than 1/max_share" in note for note in result.notes)


# ---------------------------------------------------------------------------- reliability on simulated feedback

@pytest.fixture(scope="module")
def honest_only():
    bundle, label = simulate([(30, 10, "polite", HONEST)])
    return bundle, label, assess_raters(bundle, None, TrustSettings())


def test_honest_raters_keep_their_weight_and_nobody_is_quarantined(honest_only):
    """30 polite-preferring simulated users: measured 98.6-100% of the weight kept over 5 seeds
    and 4 preferences (the reliability factor only applies to a rater significantly below the
    crowd, so sampling noise costs nothing)."""
    _, label, result = honest_only
    assert result.applied["reliability"]  # the features express "polite": the rules did run
    assert not any(rep.status == "quarantined" for rep in result.raters.values())
    assert honest_weight_kept(result, label) >= 0.95
    assert result.weight_kept >= 0.95


def test_a_contrary_swarm_of_a_quarter_of_the_accounts_loses_its_weight():
    """10 contrary accounts among 40, each rating three times as much: 57% of the raw signal.
    Measured: 0.0% of the weight after the rules, all 10 quarantined (5 seeds: 0-0.4%, 9-10)."""
    bundle, label = simulate([(30, 10, "polite", HONEST), (10, 30, "polite", CONTRARY)])
    result = assess_raters(bundle, None, TrustSettings())
    raw, share, quarantined, n = shares(result, label, "contrary")
    assert raw > 0.5
    assert share < 0.15
    assert quarantined >= 0.7 * n
    assert honest_weight_kept(result, label) >= 0.95
    kept = apply_trust(bundle, result)
    assert kept.counts["trust"]["rows_removed"]["pairs"] > 0
    assert all(any(label[r] == "polite" for r in row["raters"]) for split in ("train", "eval")
               for row in kept.pairs[split] + kept.kto[split])


def test_a_contrary_swarm_of_forty_percent_of_the_accounts_is_cut_far_below_its_raw_share():
    """20 contrary accounts among 50 at three times the volume (71% of the raw signal): a fit on
    everyone sides with the swarm (its corrections carry more evidence per person); the honest
    majority is found by the cross-fitted camps (before them, by the second Dawid-Skene run,
    started from the distrusted). Measured: 0.0% of the weight (3 seeds, 3 preferences)."""
    bundle, label = simulate([(30, 10, "concise", HONEST), (20, 30, "concise", CONTRARY)], seed=1)
    result = assess_raters(bundle, None, TrustSettings())
    raw, share, quarantined, n = shares(result, label, "contrary")
    assert raw > 0.65
    assert share < raw / 3
    assert not any(result.raters[r].status == "quarantined" for r in result.raters if label[r] == "concise")
    assert any("majority camp" in note for note in result.notes)


def test_light_content_raters_outvote_a_busy_dissatisfied_minority():
    """The attack benchmark's shape: 62 honest users with 3 questions each, mostly content (three
    thumbs up make no preference pair), and 21 contrary accounts (25%) asking 9 each, rating
    everything and correcting 40% of what they dislike -- over half of the events, and most of
    the evidence per person. Both Dawid-Skene runs sat near chance here and the guard turned
    reliability off (contrary share after the rules 40-43%); the cross-fitted camps find the
    majority. Measured over 3 seeds x 3 preferences: 76-100% of the contrary raters quarantined,
    honest share of the signal 95-100%, honest raters quarantined: none."""
    attacker = Behaviour(noise=0.0, rate_prob=1.0, correction_prob=0.4, contrary=True)
    bundle, label = simulate([(62, 3, "polite", HONEST), (21, 9, "polite", attacker)], seed=1)
    result = assess_raters(bundle, None, TrustSettings())
    raw, share, quarantined, n = shares(result, label, "contrary")
    assert raw > 0.45
    assert result.applied["reliability"]
    assert any("majority camp" in note for note in result.notes)
    assert share < 0.1 and quarantined >= 0.7 * n
    assert not any(rep.status == "quarantined" for r, rep in result.raters.items() if label[r] == "polite")
    kept = apply_trust(bundle, result)
    # what the reward model trains on: pairs with a contrary rater's judgement in them are gone
    assert all(all(label[r] == "polite" or result.raters[r].status != "quarantined" for r in row["raters"])
               for row in kept.pairs["train"])


def test_volume_does_not_buy_the_consensus():
    """60 honest users asking 5 questions and 20 contrary ones asking 15: counted by rows, the swarm
    would define what the crowd agrees on (measured without the one-rater-one-vote cap in the
    agreement fits: 43% of the weight kept, reliability not applied; with it: 0.4-5.6% over 5
    seeds)."""
    bundle, label = simulate([(60, 5, "polite", HONEST), (20, 15, "polite", CONTRARY)])
    result = assess_raters(bundle, None, TrustSettings())
    raw, share, quarantined, n = shares(result, label, "contrary")
    assert result.applied["reliability"] and share < 0.15 and quarantined >= n / 2


def test_the_guard_leaves_agreement_alone_when_the_features_cannot_express_the_preference():
    """Judgements the answer's words cannot predict (a hash of question and answer: consistent,
    but no bag of words learns it) -- like a preference that depends on the question."""
    def coin(question, answer):
        return 1.0 if zlib.crc32(f"{question}|{answer}".encode()) % 100 < 70 else 0.0

    bundle, label = simulate([(30, 10, coin, HONEST)])
    result = assess_raters(bundle, None, TrustSettings())
    assert not result.applied["reliability"] and not result.applied["quarantine"]
    assert any("cannot express" in note for note in result.notes)
    assert not any(rep.status == "quarantined" for rep in result.raters.values())
    assert all(rep.weight == 1.0 for rep in result.raters.values())  # only caps/new could act; none did


# ---------------------------------------------------------------------------- admin, new identities

def test_admin_trust_overrides_the_automatic_rules(honest_only):
    bundle, label, _ = honest_only
    contrary_bundle, contrary_label = simulate([(30, 10, "polite", HONEST), (10, 30, "polite", CONTRARY)])
    attacker = next(r for r in sorted(contrary_label) if contrary_label[r].startswith("contrary"))
    honest = 1
    infos = {attacker: RaterInfo(attacker, trust="trusted"), honest: RaterInfo(honest, trust="quarantined")}
    result = assess_raters(contrary_bundle, infos, TrustSettings())
    assert result.raters[honest].status == "quarantined" and result.raters[honest].weight == 0.0
    assert result.raters[honest].reasons == ("quarantined by an admin",)
    trusted = result.raters[attacker]
    assert trusted.status == "trusted" and "trusted by an admin" in trusted.reasons and trusted.weight > 0
    assert not any(reason.startswith("down-weighted") for reason in trusted.reasons)  # capped at most
    kept = apply_trust(contrary_bundle, result)
    assert not any(row["raters"] == (honest,) for split in ("train", "eval") for row in kept.kto[split])
    with pytest.raises(ValueError, match="trust"):
        assess_raters(bundle, {1: RaterInfo(1, trust="maybe")}, TrustSettings())


def test_new_identities_count_new_weight_and_unknown_raters_are_not_new(honest_only):
    bundle, label, _ = honest_only
    old = {r: RaterInfo(r, account_age_hours=500.0, prior_events=50) for r in label}
    fresh = {**old, 1: RaterInfo(1, account_age_hours=2.0, prior_events=50),
             2: RaterInfo(2, account_age_hours=500.0, prior_events=0),
             3: RaterInfo(3, account_age_hours=500.0, prior_events=0, signed_in=True)}
    result = assess_raters(bundle, fresh, TrustSettings(iterations=0))
    for r in (1, 2):
        assert result.raters[r].status == "new" and result.raters[r].weight == pytest.approx(0.5)
    assert result.raters[3].status == "normal"  # signed in: new by age only
    assert result.rules["new"]["raters"] == 2 and result.applied["new"]
    unknown = assess_raters(bundle, None, TrustSettings(iterations=0))
    assert not any(rep.status == "new" for rep in unknown.raters.values())


# ---------------------------------------------------------------------------- applying

def test_apply_trust_drops_quarantined_rows_and_weighs_the_others():
    up, down = FeedbackRecord(thumb="up"), FeedbackRecord(thumb="down")
    records = [conv(1, 1, [("good answer", up)], question="Same?"),
               conv(2, 2, [("bad answer", down)], question="Same?"),
               conv(3, 3, [("Rinse it.", up), ("Ugh.", down)], question="Rice?"),
               conv(4, None, [("whose?", up)], question="Who?")]
    bundle = build_datasets(records, ALL_TRAIN)
    infos = {1: RaterInfo(1, account_age_hours=2.0), 2: RaterInfo(2, account_age_hours=100.0, prior_events=50),
             3: RaterInfo(3, trust="quarantined")}
    result = assess_raters(bundle, infos, TrustSettings(iterations=0, max_share=1.0))
    kept = apply_trust(bundle, result)
    pairs = {r["source"]: r for r in kept.pairs["train"]}
    assert set(pairs) == {"same_prompt"}  # rater 3's siblings pair is gone
    # joined from new rater 1's thumb up and rater 2's thumb down: as trusted as the less trusted
    assert pairs["same_prompt"]["weight"] == pytest.approx(0.5)
    kto = {r["completion"][0]["content"]: r["weight"] for r in kept.kto["train"]}
    assert kto == {"good answer": 0.5, "bad answer": 1.0, "whose?": 1.0}
    assert {r["prompt"][0]["content"] for r in kept.prompts["train"]} == {"Same?", "Who?"}
    assert kept.counts["pairs"]["train"] == 1 and kept.counts["kto"]["train"] == 3
    # rated pairs across questions are joined like same_prompt ones: the 3 with rater 3's answers go,
    # the one joining the unknown rater's "whose?" and rater 2's "bad answer" stays
    assert kept.counts["trust"]["rows_removed"] == {"pairs": 1, "kto": 2, "sft": 1, "prompts": 1, "criteria": 0,
                                                    "rated": 3}
    assert [(r["chosen"], r["rejected"], r["weight"]) for r in kept.rated["train"]] == [("whose?", "bad answer", 1.0)]
    assert kept.counts["trust"]["raters"]["3"]["status"] == "quarantined"
    assert row_weight({"raters": ()}, result) == 1.0 and row_weight({"raters": (3,)}, result) is None
    # a row two raters gave identically keeps the other's word; a pair joined from a quarantined
    # rater's judgement is gone
    assert row_weight({"raters": (2, 3)}, result) == pytest.approx(0.5)
    assert row_weight({"raters": (2, 3), "source": "same_prompt"}, result) is None
    assert bundle.pairs["train"][0].get("weight") is None  # the input bundle is untouched


def test_prepare_data_weighs_raters_unless_disabled():
    records, _ = simulate_records([(12, 6, "polite", HONEST)], seed=3)
    settings = CycleSettings(min_pairs=1, min_prompts=1)
    bundle = prepare_data(records, settings, {1: RaterInfo(1, trust="quarantined")})
    trust = bundle.counts["trust"]
    assert trust["raters"]["1"]["status"] == "quarantined" and set(trust["rules"]) >= {"quarantined", "capped"}
    assert all(1 not in row["raters"] or len(row["raters"]) > 1 for row in bundle.kto["train"] + bundle.kto["eval"])
    assert all("weight" in row for row in bundle.pairs["train"] + bundle.kto["train"] + bundle.sft["train"])
    plain = prepare_data(records, replace(settings, trust=TrustSettings(enabled=False)))
    assert "trust" not in plain.counts and not any("weight" in row for row in plain.pairs["train"])


def test_resampling_by_weight_keeps_equal_weights_as_they_are():
    rows = [{"i": i, "weight": 1.0} for i in range(10)]
    assert resample_by_weight(rows, 0) == rows
    assert resample_by_weight([{"i": 1}], 0) == [{"i": 1}]
    weighted = [{"i": 0, "weight": 0.0}, {"i": 1, "weight": 1.0}, {"i": 2, "weight": 3.0}, {"i": 3, "weight": 0.0}]
    out = resample_by_weight(weighted, 0)
    assert len(out) == 4 and [r["i"] for r in out].count(2) == 3 and [r["i"] for r in out].count(1) == 1
    assert resample_by_weight(weighted, 0) == out  # seeded


# ---------------------------------------------------------------------------- weighted reward model

@pytest.fixture
def reward_trainer(micro_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig

    from rlhf.reward.training import weighted_reward_trainer

    trainer_class, collator_class = weighted_reward_trainer()
    tok = AutoTokenizer.from_pretrained(micro_model_dir)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(micro_model_dir, num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    torch.nn.init.normal_(model.score.weight, std=0.5)  # rewards far from 0: the loss terms differ per pair
    args = RewardConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, report_to=[], use_cpu=True,
                        center_rewards_coefficient=0.01, max_length=64)
    from datasets import Dataset

    pairs = [{"chosen_ids": tok(t)["input_ids"], "rejected_ids": tok(u)["input_ids"], "margin": m, "weight": 1.0}
             for t, u, m in (("Sure! Rinse it.", "Ugh, rinse it.", 1.0), ("Happy to help.", "Whatever.", 0.5),
                             ("Good luck!", "Stop bothering me.", 0.0), ("Of course.", "Figure it out.", 1.0))]
    trainer = trainer_class(model=model, args=args, train_dataset=Dataset.from_list(pairs), processing_class=tok,
                            data_collator=collator_class(pad_token_id=tok.pad_token_id))
    model.eval()  # no dropout: two forward passes give the same numbers
    return trainer, collator_class(pad_token_id=tok.pad_token_id), pairs, tok


def test_weighted_reward_loss_with_unit_weights_is_trls_loss(reward_trainer):
    from trl import RewardTrainer

    trainer, collate, pairs, _ = reward_trainer
    assert "weight" in trainer.train_dataset.column_names  # the column survives TRL's preparation
    assert "weight" in next(iter(trainer.get_train_dataloader()))
    batch = collate(pairs)
    plain = RewardTrainer.compute_loss(trainer, trainer.model, {k: v for k, v in batch.items() if k != "weight"})
    weighted = trainer.compute_loss(trainer.model, dict(batch))
    assert weighted.item() == plain.item()
    halved = trainer.compute_loss(trainer.model, {**batch, "weight": batch["weight"] * 0.5})
    assert halved.item() == pytest.approx(plain.item() * 0.5, rel=1e-5)


def test_a_pair_of_weight_zero_gives_no_gradient(reward_trainer):
    import torch

    trainer, collate, pairs, tok = reward_trainer

    def grads(rows):
        trainer.model.zero_grad()
        trainer.compute_loss(trainer.model, collate(rows)).backward()
        return [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]

    zero = [{**pairs[0], "weight": 0.0}] + pairs[1:]
    other = [{**zero[0], "chosen_ids": tok("A completely different answer.")["input_ids"]}] + pairs[1:]
    for a, b in zip(grads(zero), grads(other)):
        assert torch.allclose(a, b, atol=1e-6)
    changed = [{**pairs[0], "chosen_ids": other[0]["chosen_ids"]}] + pairs[1:]  # weight 1: it counts
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(grads(pairs), grads(changed)))
