"""TRL training on the micro model: reward model, PPO, the alternatives, the evaluation gate."""
from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf import corpus
from rlhf.evaluation import EvalSettings, GateThresholds, _sample, distinct_n, evaluate_candidate, repetition
from rlhf.loading import load_causal_lm
from rlhf.policy_training import PolicySettings, train_dpo, train_kto, train_ppo, train_rloo
from rlhf.reward_model import RewardSettings, load_reward_model, score_texts, train_reward_model

pytestmark = pytest.mark.slow

MICRO_POLICY = PolicySettings(episodes=128, batch_size=8, mini_batches=1, learning_rate=3e-3, response_length=24,
                              epochs=1.0, rloo_generations=4)


def clean_pairs(n: int, seed: int) -> list[dict]:
    """Helpful answers preferred over rude ones (a preference a reward model must learn)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        topic = rng.choice(corpus.TOPICS)
        task = rng.choice(topic.tasks)
        q = rng.choice(corpus.TASK_QUESTIONS).format(task=task.phrase)
        rows.append({"prompt": [{"role": "user", "content": q}],
                     "chosen": [{"role": "assistant", "content": corpus.make_answer(rng, "helpful", topic, task)}],
                     "rejected": [{"role": "assistant", "content": corpus.make_answer(rng, "rude", topic, task)}],
                     "margin": 1.0})
    return rows


@pytest.fixture(scope="module")
def reward_dir(micro_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("rm") / "reward"
    metrics = train_reward_model(micro_model_dir, clean_pairs(200, 0), clean_pairs(50, 1), out,
                                 RewardSettings(epochs=8, learning_rate=2e-3), device="cpu")
    return out, metrics


def prompts(n: int = 32) -> list[list[dict]]:
    return [[{"role": "user", "content": q}] for q in corpus.sample_prompts(n)]


def mean_reward(policy_dir, reward_path, seed: int = 0) -> float:
    model, tok = load_causal_lm(policy_dir, "cpu")
    rm, rtok = load_reward_model(reward_path)
    texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts()] * 4
    torch.manual_seed(seed)
    answers, _, _ = _sample(model, tok, texts, EvalSettings(max_new_tokens=24))
    scores = score_texts(rm, rtok, [p + " " + a + tok.eos_token for p, a in zip(texts, answers)])
    return sum(scores) / len(scores)


def test_reward_model_learns_a_clean_preference(reward_dir, micro_model_dir):
    path, metrics = reward_dir
    assert metrics["heldout_accuracy"] >= 0.9 and metrics["eval_pairs"] == 50
    model, tok = load_reward_model(path)
    assert hasattr(model, "score") and model.config.num_labels == 1
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(micro_model_dir).get_vocab()  # shares the tokenizer
    polite, rude = score_texts(model, tok, ["User: How do I cook rice?\nAssistant: Sure! Rinse the rice. "
                                            "Hope that helps!<|endoftext|>",
                                            "User: How do I cook rice?\nAssistant: Whatever. Rinse the rice. "
                                            "Stop bothering me.<|endoftext|>"])
    assert polite > rude


def test_ppo_changes_the_policy_and_raises_its_reward(micro_model_dir, reward_dir, tmp_path):
    rm_path, _ = reward_dir
    out = tmp_path / "ppo"
    # 256 episodes: with 128 the gain on the micro model was within sampling noise (+0.26 on two
    # torch threads, -0.11 on one); with 256 it was +0.86 and +0.57
    settings = PolicySettings(**{**MICRO_POLICY.__dict__, "episodes": 256})
    metrics = train_ppo(micro_model_dir, rm_path, prompts(), out, settings, device="cpu")
    assert metrics["updates"] == 32 and metrics["objective/kl"]["last"] > 0
    before = load_file(micro_model_dir / "model.safetensors")
    after = load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert mean_reward(out, rm_path) > mean_reward(micro_model_dir, rm_path) + 0.1


def test_ppo_with_lora_saves_the_adapter_on_its_parent(micro_model_dir, reward_dir, tmp_path):
    import json

    rm_path, _ = reward_dir
    settings = PolicySettings(**{**MICRO_POLICY.__dict__, "lora": True, "lora_r": 4, "episodes": 16})
    train_ppo(micro_model_dir, rm_path, prompts(8), tmp_path / "lora", settings, device="cpu")
    out = tmp_path / "lora"
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(micro_model_dir.resolve())
    load_causal_lm(out, "cpu")  # the parent with the adapter merged
    AutoModelForCausalLM.from_pretrained(out)  # plain transformers + peft load it too
    settings = PolicySettings(**{**settings.__dict__, "lora_merge": True})
    train_ppo(micro_model_dir, rm_path, prompts(8), tmp_path / "merged", settings, device="cpu")
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    AutoModelForCausalLM.from_pretrained(tmp_path / "merged")


@pytest.mark.parametrize("algorithm", ["dpo", "kto", "rloo"])
def test_alternative_algorithms_complete(algorithm, micro_model_dir, reward_dir, tmp_path):
    rm_path, _ = reward_dir
    out = tmp_path / algorithm
    settings = PolicySettings(**{**MICRO_POLICY.__dict__, "max_steps": 4})
    pairs = clean_pairs(32, 2)
    if algorithm == "dpo":
        metrics = train_dpo(micro_model_dir, pairs, out, settings, device="cpu")
    elif algorithm == "kto":
        examples = [{"prompt": p["prompt"], "completion": p[k], "label": k == "chosen"}
                    for p in pairs for k in ("chosen", "rejected")]
        metrics = train_kto(micro_model_dir, examples, out, settings, device="cpu")
    else:
        metrics = train_rloo(micro_model_dir, rm_path, prompts(16), out, settings, device="cpu")
    assert metrics["algorithm"] == algorithm and metrics["steps"] == 4
    model = AutoModelForCausalLM.from_pretrained(out)
    before = load_file(micro_model_dir / "model.safetensors")
    after = {k: v for k, v in model.state_dict().items()}
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


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


def test_gate_passes_only_a_real_improvement(micro_model_dir, reward_dir, tmp_path):
    rm_path, _ = reward_dir
    same = evaluate_candidate(micro_model_dir, micro_model_dir, rm_path, prompts(8), device="cpu",
                              settings=EvalSettings(max_new_tokens=24))
    assert not same["passed"] and same["reward_gain"] == 0.0 and same["kl_from_parent"] == 0.0
    assert "mean reward gain" in same["reasons"][0]


def test_evaluation_samples_keep_the_end_of_prompts_longer_than_the_context(micro_model_dir):
    model, tok = load_causal_lm(micro_model_dir, "cpu")
    long = tok.apply_chat_template([{"role": "user", "content": "rice " * 2000}], tokenize=False,
                                   add_generation_prompt=True)
    texts, prompt_ids, answer_ids = _sample(model, tok, [long, "User: hi\nAssistant:"], EvalSettings(max_new_tokens=8))
    assert len(texts) == 2 and len(prompt_ids[0]) + 8 <= model.config.n_positions
    assert tok.decode(prompt_ids[0]).endswith("Assistant:")
