"""The evaluation gate on the micro model: degeneration, implicit margins on held-out pairs, the sign
test, the judge."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf.gate.evaluation import distinct_n, evaluate_candidate, repetition
from rlhf.gate.instruments import implicit_margins, pair_sequences, sequence_logprobs, sign_test
from rlhf.gate.verdict import decided_by, evidence_reasons
from rlhf.models.loading import load_causal_lm
from rlhf.models.sampling import answer_logprob, sample_answers
from rlhf.policy import train_dpo
from rlhf.settings import EvalSettings, GateThresholds, PolicySettings
from tests.support.training import MICRO_POLICY, clean_pairs, prompts

pytestmark = pytest.mark.slow


def test_degeneration_metrics():
    assert repetition("the cat the cat the cat the cat") > 0.5
    assert repetition("Rinse the rice in cold water first.") == 0.0
    assert distinct_n(["a b c d"], 2) == 1.0 and distinct_n(["a a a a"], 2) == 1 / 3


def make_degenerate(src, dst):
    """A model that says the same token forever: final layer norm outputs a constant vector."""
    model = AutoModelForCausalLM.from_pretrained(src)
    tok = AutoTokenizer.from_pretrained(src)
    with torch.no_grad():
        token = tok(" the", add_special_tokens=False)["input_ids"][0]
        direction = model.transformer.wte.weight[token]
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(direction / direction.norm() * 1e4)
    model.save_pretrained(dst)
    tok.save_pretrained(dst)


def test_gate_rejects_a_degenerate_candidate(micro_model_dir, reward_dir, tmp_path):
    rm_path, _ = reward_dir
    make_degenerate(micro_model_dir, tmp_path / "degenerate")
    result = evaluate_candidate(tmp_path / "degenerate", micro_model_dir, rm_path, prompts(8),
                                GateThresholds(min_reward_gain=-100.0), EvalSettings(max_new_tokens=24), device="cpu")
    assert not result["passed"]
    assert any("repetition" in r or "distinct-2" in r or "empty" in r for r in result["reasons"])
    assert result["candidate"]["distinct2"] < result["parent"]["distinct2"]


@pytest.fixture(scope="module")
def dpo_candidate(micro_model_dir, tmp_path_factory):
    """A few DPO steps on helpful-over-rude pairs: a candidate the held-out pairs agree with."""
    out = tmp_path_factory.mktemp("dpo") / "policy"
    settings = PolicySettings(**{**MICRO_POLICY.__dict__, "max_steps": 8, "learning_rate": 1e-3})
    train_dpo(micro_model_dir, clean_pairs(64, 2), out, settings, device="cpu")
    return out


def test_implicit_margin_of_the_parent_against_itself_is_exactly_zero(micro_model_dir):
    model, tok = load_causal_lm(micro_model_dir, "cpu")
    margins = implicit_margins(model, model, tok, clean_pairs(12, 5))
    assert margins == [0.0] * 12
    assert sign_test(margins) == {"pairs": 12, "wins": 0, "losses": 0, "ties": 12, "share": None, "ci95": [None, None],
                                  "p_value": 1.0, "p_worse": 1.0, "mean_margin": 0.0}


def test_batched_answer_logprobs_equal_one_sequence_at_a_time(micro_model_dir):
    """Right padding and batching change nothing: each pair's answer log-probability is the sum
    over its answer tokens alone, as a single unpadded forward pass computes it."""
    model, tok = load_causal_lm(micro_model_dir, "cpu")
    rows = clean_pairs(5, 6)
    rows[0]["prompt"][0]["content"] += " please" * 400  # longer than the context: the prompt's start goes
    seqs = pair_sequences(tok, rows, model.config.n_positions)
    assert all(len(p) + len(a) <= model.config.n_positions for p, a in seqs)
    assert tok.decode(seqs[0][0]).endswith("Assistant:") and seqs[0][1][-1] == tok.eos_token_id
    batched = sequence_logprobs(model, seqs, tok.pad_token_id, batch_size=4)
    single = [answer_logprob(model, p, a) for p, a in seqs]
    assert batched == pytest.approx(single, abs=1e-3)


def test_rated_pairs_render_each_side_under_its_own_prompt_for_the_gate(micro_model_dir):
    """The gate's held-out evidence includes rated pairs (a liked answer over a disliked one to
    another question): each side is rendered as a same-prompt pair would render it."""
    model, tok = load_causal_lm(micro_model_dir, "cpu")
    a, b = clean_pairs(2, 8)
    rated = {"chosen_prompt": a["prompt"], "chosen": a["chosen"][0]["content"], "rejected_prompt": b["prompt"],
             "rejected": b["rejected"][0]["content"], "margin": 1.0, "source": "rated"}
    n = model.config.n_positions
    assert pair_sequences(tok, [rated], n) == [pair_sequences(tok, [a], n)[0], pair_sequences(tok, [b], n)[1]]
    assert implicit_margins(model, model, tok, [rated]) == [0.0]


def test_sign_test_leaves_ties_out_and_reports_wilson_and_the_one_sided_p_value():
    result = sign_test([0.5] * 7 + [-0.2] + [0.0] * 3)
    assert (result["pairs"], result["wins"], result["losses"], result["ties"]) == (11, 7, 1, 3)
    assert result["share"] == 0.875 and result["p_value"] == pytest.approx(9 / 256, rel=1e-3)  # P(X >= 7 | 8, 1/2)
    assert result["p_worse"] == pytest.approx(255 / 256, rel=1e-3)  # P(X <= 7 | 8, 1/2)
    z, n, p = 1.959964, 8, 7 / 8  # Wilson's interval by its formula
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    assert result["ci95"] == pytest.approx([centre - half, centre + half], abs=1e-4)


def test_held_out_preferences_favour_a_candidate_trained_on_agreeing_pairs(micro_model_dir, reward_dir, dpo_candidate):
    """The held-out pairs measure the candidate's move towards the preferred answers, with its size; a
    trusted judge that finds no gain in the candidate's own answers (here: 24-token answers to 8
    prompts) is not outvoted by them, and without that judge the pairs carry the verdict."""
    rm_path, metrics = reward_dir
    held_out = clean_pairs(24, 7)  # never trained on: DPO saw clean_pairs(64, 2)
    result = evaluate_candidate(dpo_candidate, micro_model_dir, rm_path, prompts(8), device="cpu",
                                settings=EvalSettings(max_new_tokens=24), heldout_pairs=held_out, judge_dir=rm_path,
                                judge_info={"accuracy": metrics["heldout_accuracy"], "accuracy_pairs": 50})
    h, judge, t = result["heldout"], result["judge"], GateThresholds()
    assert h["pairs"] == 24 and h["share"] > 0.5 and h["p_value"] < 0.025 and h["mean_margin"] > 0
    assert h["ci95"][0] > 0.5
    assert h["margin_low"] > t.min_margin and h["effect_p"] < 0.025  # the size of the move, not only its direction
    assert result["judged_by"][0].startswith("held-out preferences: implicit reward margin vs the parent on 24 pairs")
    if judge["trusted"] and judge["p_any_gain"] >= t.judge_flat_p:  # the judge saw no gain in the candidate's answers
        assert not result["passed"] and result["reasons"][0].startswith("the judge finds no gain")
    else:
        assert result["passed"] and result["reasons"] == []
    alone = {**judge, "trusted": False}  # a judge that does not count leaves the pairs their say
    assert evidence_reasons(h, alone, t) == []
    assert decided_by(h, alone, t)["by"] == ["held-out pairs"]


def test_gate_does_not_pass_a_copy_of_the_parent(micro_model_dir, reward_dir, tmp_path):
    import shutil

    rm_path, metrics = reward_dir
    shutil.copytree(micro_model_dir, tmp_path / "copy")
    same = evaluate_candidate(tmp_path / "copy", micro_model_dir, rm_path, prompts(8), device="cpu",
                              settings=EvalSettings(max_new_tokens=24), heldout_pairs=clean_pairs(16, 7),
                              judge_dir=rm_path, judge_info={"accuracy": metrics["heldout_accuracy"],
                                                             "accuracy_pairs": 50})
    assert not same["passed"] and same["verdict"] == "rejected"
    h, judge = same["heldout"], same["judge"]
    assert h["ties"] == 16 and h["p_value"] == 1.0 and h["mean_margin"] == 0
    assert judge["trusted"] and judge["gain"] == 0.0 and judge["p_value"] == 1.0
    assert same["reward_gain"] == 0.0 and same["kl_from_parent"] == 0.0
    assert same["evidence_p"] == 1.0 and same["reasons"] == [
        "the judge finds no gain (judge gain 0.000 over 8 prompts, p above 0.2 = 1; p of any gain = 1, not below 0.5): "
        "the held-out pairs alone "
        "cannot pass a candidate a trusted judge calls flat (held-out preferences: the candidate favours the chosen "
        "answer more than the parent on 0 of 16 pairs (0 less, 16 tied; no pair separates them), sign test p = 1; "
        "mean margin 0 nats, at least 0 with 95% confidence (the gate needs more than 0.75), p = 1)"]
    assert same["decided_by"]["better"] is False and same["decided_by"]["by"] == []


def test_gate_says_not_enough_evidence_below_the_minimum_of_held_out_pairs(micro_model_dir, reward_dir, dpo_candidate):
    rm_path, metrics = reward_dir
    result = evaluate_candidate(dpo_candidate, micro_model_dir, rm_path, prompts(8), device="cpu",
                                settings=EvalSettings(max_new_tokens=24), heldout_pairs=clean_pairs(3, 7),
                                judge_dir=rm_path, judge_info={"accuracy": metrics["heldout_accuracy"],
                                                               "accuracy_pairs": 50})
    assert not result["passed"] and result["verdict"] == "not enough evidence"
    assert result["reasons"][0] == ("not enough evidence: 3 held-out preference pairs, the gate needs at least 8 "
                                    "(training.gate.min_heldout_pairs)")
    assert result["heldout"]["pairs"] == 3 and result["judged_by"][0].startswith("nothing: 3 held-out")
    # the optimized-against reward model alone never passes a candidate, however large its gain
    alone = evaluate_candidate(dpo_candidate, micro_model_dir, rm_path, prompts(8), device="cpu",
                               thresholds=GateThresholds(min_reward_gain=-100.0, max_kl=1e9),
                               settings=EvalSettings(max_new_tokens=24))
    assert not alone["passed"] and alone["verdict"] == "not enough evidence"


def test_evaluation_samples_keep_the_end_of_prompts_longer_than_the_context(micro_model_dir):
    model, tok = load_causal_lm(micro_model_dir, "cpu")
    long = tok.apply_chat_template([{"role": "user", "content": "rice " * 2000}], tokenize=False,
                                   add_generation_prompt=True)
    texts, prompt_ids, answer_ids = sample_answers(model, tok, [long, "User: hi\nAssistant:"],
                                                   EvalSettings(max_new_tokens=8))
    assert len(texts) == 2 and len(prompt_ids[0]) + 8 <= model.config.n_positions
    assert tok.decode(prompt_ids[0]).endswith("Assistant:")


def test_the_judge_scores_only_its_own_questions_and_a_repeated_question_counts_once(
        micro_model_dir, reward_dir, dpo_candidate, monkeypatch):
    """As rlhf.cycle.evaluation_prompts lays them out on a small deployment: 3 held-out questions asked
    twice for the judge, then 4 training questions for the KL and degeneration checks. The judge
    scores the 6 judged askings and nothing else; the summaries behind the degeneration checks see each
    of the 7 distinct questions once; the examples show each question once."""
    from rlhf.gate import evaluation

    rm_path, metrics = reward_dir
    asked = prompts(7)
    heldout, train = asked[:3], asked[3:]
    spp = EvalSettings().samples_per_prompt
    scored: list[int] = []  # how many answers each reward-model pass scored
    summarized: list[int] = []  # how many answers each summary (reward, distinct-2, repetition) counted
    real_scores, real_summary = evaluation._scores, evaluation._summary
    monkeypatch.setattr(evaluation, "_scores", lambda d, dev, histories, answers: (
        scored.append(len(histories)), real_scores(d, dev, histories, answers))[1])
    monkeypatch.setattr(evaluation, "_summary", lambda texts, *rest: (
        summarized.append(len(texts)), real_summary(texts, *rest))[1])
    result = evaluate_candidate(dpo_candidate, micro_model_dir, rm_path, heldout * 2 + train, device="cpu",
                                settings=EvalSettings(max_new_tokens=16), heldout_pairs=clean_pairs(12, 7),
                                judge_dir=rm_path, judged_prompts=6,
                                judge_info={"accuracy": metrics["heldout_accuracy"], "accuracy_pairs": 50})
    assert result["prompts"] == 10 and result["samples"] == 10 * spp
    assert scored == [10 * spp, 6 * spp]  # the run's reward model: every answer; the judge: its 6 askings only
    assert result["judge"]["prompts"] == 6  # the judge's paired test has one unit per judged asking
    assert summarized == [7 * spp, 7 * spp]  # parent and candidate: each distinct question once
    shown = [e["prompt"] for e in result["examples"]]
    assert len(shown) == 6 and len(set(shown)) == 6


def test_the_gate_reads_what_the_policy_trained_on(micro_model_dir, reward_dir, dpo_candidate):
    """With the policy's max_length, every instrument reads the end of each prompt that fits it, as DPO
    trained (keep_end): the held-out margins are those of the cut sequences, the sampled prompts fit."""
    candidate, tok = load_causal_lm(dpo_candidate, "cpu")
    parent, _ = load_causal_lm(micro_model_dir, "cpu")
    history = [{"role": "user", "content": "How do I cook pasta?"}, {"role": "assistant", "content": "Boil it. " * 6},
               {"role": "user", "content": "How do I cook rice?"}]
    pairs = [{**row, "prompt": history[:-1] + row["prompt"]} for row in clean_pairs(10, 7)]
    seqs = pair_sequences(tok, pairs, 48)
    assert all(len(p) + len(a) <= 48 for p, a in seqs) and max(len(p) for p, _ in pair_sequences(tok, pairs, 128)) > 48
    cut = implicit_margins(candidate, parent, tok, pairs, 48)
    c, p = (sequence_logprobs(model, seqs, tok.pad_token_id) for model in (candidate, parent))
    assert cut == pytest.approx([(c[2 * i] - p[2 * i]) - (c[2 * i + 1] - p[2 * i + 1]) for i in range(10)], abs=1e-4)
    assert cut != pytest.approx(implicit_margins(candidate, parent, tok, pairs), abs=1e-3)
    result = evaluate_candidate(dpo_candidate, micro_model_dir, reward_dir[0], [history] * 4, device="cpu",
                                settings=EvalSettings(max_new_tokens=16), heldout_pairs=pairs, max_length=48)
    assert result["max_length"] == 48 and result["heldout"]["pairs"] == 10 and result["samples"] == 8
