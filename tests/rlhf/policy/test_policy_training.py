"""Policy training through TRL on the micro model: PPO (with a LoRA critic, with LoRA), DPO, KTO, RLOO,
iterative DPO."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlhf.gate.instruments import implicit_margins, sign_test
from rlhf.models.loading import load_causal_lm
from rlhf.policy import reward_ranked_pairs, train_dpo, train_iterative_dpo, train_kto, train_ppo, train_rloo
from rlhf.settings import PolicySettings
from tests.support.training import MICRO_POLICY, clean_pairs, mean_reward, prompts

pytestmark = pytest.mark.slow


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


def test_ppo_with_a_lora_critic_still_learns_its_values_and_rewards(micro_model_dir, reward_dir, tmp_path):
    """With lora, PPO's value model is a LoRA adapter plus its score head (lora_value, the default).
    Its value loss must still fall and the rollouts' reward rise as with a critic trained in full
    (measured: value loss 6.08 -> 1.59 full, 3.91 -> 1.24 LoRA; scores -1.29 -> 0.54 / 0.53)."""
    rm_path, _ = reward_dir
    settings = PolicySettings(**{**MICRO_POLICY.__dict__, "episodes": 256, "lora": True, "lora_r": 8})
    assert settings.lora_value
    metrics = train_ppo(micro_model_dir, rm_path, prompts(), tmp_path / "lora-critic", settings, device="cpu")
    assert metrics["lora_value"] is True
    assert metrics["loss/value_avg"]["last"] < 0.5 * metrics["loss/value_avg"]["first"]
    assert metrics["objective/scores"]["last"] > metrics["objective/scores"]["first"] + 1.0


def test_ppo_refuses_fewer_prompts_than_a_batch_instead_of_looping_forever(micro_model_dir, reward_dir, tmp_path):
    rm_path, _ = reward_dir  # MICRO_POLICY's batch is 8 prompts: TRL's loader would never yield one
    with pytest.raises(ValueError, match="PPO needs at least one batch of prompts per process: 4 prompts"):
        train_ppo(micro_model_dir, rm_path, prompts(4), tmp_path / "ppo", MICRO_POLICY, device="cpu")
    assert not (tmp_path / "ppo").exists()


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


@pytest.mark.parametrize("algorithm", ["dpo", "kto", "rloo", "iterative_dpo"])
def test_alternative_algorithms_learn(algorithm, micro_model_dir, reward_dir, tmp_path):
    """Each trains, and moves the policy the way its signal points: DPO and KTO (on helpful-over-rude
    pairs) favour the helpful answer of pairs they never saw more than the parent does; RLOO and
    iterative DPO (on the reward model that learned that preference) raise the policy's mean reward.
    DPO and KTO get 9 rows in batches of 3 with PPO's ``mini_batches`` at 2: that PPO rule (batch a
    multiple of the mini-batches) is not theirs and must not refuse them."""
    rm_path, _ = reward_dir
    out = tmp_path / algorithm
    settings = PolicySettings(**{**MICRO_POLICY.__dict__, "max_steps": 4})
    pairs = clean_pairs(32, 2)
    if algorithm == "dpo":
        odd = PolicySettings(**{**settings.__dict__, "batch_size": 3, "mini_batches": 2})
        metrics = train_dpo(micro_model_dir, pairs[:9], out, odd, device="cpu")
    elif algorithm == "kto":
        examples = [{"prompt": p["prompt"], "completion": p[k], "label": k == "chosen"}
                    for p in pairs for k in ("chosen", "rejected")]
        odd = PolicySettings(**{**settings.__dict__, "batch_size": 3, "mini_batches": 2})
        metrics = train_kto(micro_model_dir, examples[:9], out, odd, device="cpu")
    elif algorithm == "rloo":
        metrics = train_rloo(micro_model_dir, rm_path, prompts(16), out, settings, device="cpu")
    else:
        metrics = train_iterative_dpo(micro_model_dir, rm_path, prompts(16), out, settings, device="cpu")
        sampled = metrics["sampled"]
        assert sampled["answers"] == 16 * settings.samples_per_prompt and 0 < sampled["pairs"] <= 16 * 2
    assert metrics["algorithm"] == algorithm and metrics["steps"] == 4
    if algorithm in ("dpo", "kto"):
        candidate, tok = load_causal_lm(out, "cpu")
        parent, _ = load_causal_lm(micro_model_dir, "cpu")
        result = sign_test(implicit_margins(candidate, parent, tok, clean_pairs(24, 7)))
        assert result["wins"] > result["losses"] and result["mean_margin"] > 0, result
    else:
        assert mean_reward(out, rm_path) > mean_reward(micro_model_dir, rm_path)


def test_iterative_dpo_trains_on_fewer_pairs_than_a_batch_with_the_default_mini_batches(
        micro_model_dir, reward_dir, tmp_path):
    """A deployment of few questions gives iterative DPO an odd handful of pairs; the batch shrinks
    to them, and PPO's mini-batch rule (batch a multiple of 2) must not refuse a DPO run."""
    rm_path, _ = reward_dir
    settings = PolicySettings(**{**MICRO_POLICY.__dict__, "mini_batches": 2, "max_steps": 2,
                                 "pairs_per_prompt": 1, "min_pair_gap": 0.0})
    metrics = train_iterative_dpo(micro_model_dir, rm_path, prompts(3), tmp_path / "idpo", settings, device="cpu")
    assert metrics["sampled"]["pairs"] == 3 and metrics["pairs"] == 3 and metrics["steps"] == 2
    # policy.max_prompts: of 5 prompts only 2 are sampled (many turns of multi-turn chats)
    capped = PolicySettings(**{**settings.__dict__, "max_prompts": 2})
    metrics = train_iterative_dpo(micro_model_dir, rm_path, prompts(5), tmp_path / "capped", capped, device="cpu")
    assert metrics["sampled"]["prompts"] == 2 and metrics["sampled"]["answers"] == 2 * capped.samples_per_prompt
    # policy.min_steps: 3 pairs make one batch, so 2 passes would be 2 steps; whole passes until at least 5
    few = PolicySettings(**{**settings.__dict__, "max_steps": None, "epochs": 2.0, "min_steps": 5})
    metrics = train_iterative_dpo(micro_model_dir, rm_path, prompts(3), tmp_path / "few", few, device="cpu")
    assert metrics["pairs"] == 3 and metrics["steps"] == 5
    # policy.top_p reaches the sampler: with a nucleus of almost nothing every answer to a prompt is the
    # parent's most likely one, and identical answers make no pair however little gap is asked
    narrow = PolicySettings(**{**settings.__dict__, "top_p": 1e-6})
    with pytest.raises(ValueError, match="no two differed"):
        train_iterative_dpo(micro_model_dir, rm_path, prompts(3), tmp_path / "narrow", narrow, device="cpu")


def test_reward_ranked_pairs_take_best_over_worst_where_the_reward_model_separates_them():
    prompt_a, prompt_b = [{"role": "user", "content": "a?"}], [{"role": "user", "content": "b?"}]
    answers = [["good", "ok", "meh", "bad"], ["same", "same", "", "x"]]
    scores = [[3.0, 1.0, 0.0, -3.0], [0.0, 0.01, 2.0, 0.02]]
    rows, kept = reward_ranked_pairs([prompt_a, prompt_b], answers, scores, pairs_per_prompt=2, min_gap=0.5)
    pairs = [(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows]
    # prompt a: best over worst, second over second worst; prompt b: the top answer is empty (never
    # chosen) and the rest differ by far less than the spread of all scores
    assert pairs == [("good", "bad"), ("ok", "meh")]
    assert rows[0]["prompt"] == prompt_a and kept["pairs"] == 2 and kept["answers"] == 8
    assert reward_ranked_pairs([prompt_a], [answers[0]], [scores[0]], 1, min_gap=10.0)[0] == []




def _weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_dpo_in_micro_batches_makes_the_same_update_as_the_whole_batch(micro_model_dir, tmp_path):
    """policy.micro_batch_size splits a step's rows into forward passes (gradient accumulation) to
    bound memory; the update is the whole batch's: the two candidates differ from each other far
    less than either moved from the parent."""
    settings = PolicySettings(**{**MICRO_POLICY.__dict__, "batch_size": 4, "max_steps": 2})
    pairs = clean_pairs(8, 3)
    whole = train_dpo(micro_model_dir, pairs, tmp_path / "whole", settings, device="cpu")
    micro = train_dpo(micro_model_dir, pairs, tmp_path / "micro",
                      PolicySettings(**{**settings.__dict__, "micro_batch_size": 2}), device="cpu")
    assert whole["steps"] == micro["steps"] == 2 and (whole["micro_batches"], micro["micro_batches"]) == (1, 2)
    parent, a, b = _weights(micro_model_dir), _weights(tmp_path / "whole"), _weights(tmp_path / "micro")
    moved = max((a[k] - parent[k]).abs().max().item() for k in a)
    apart = max((a[k] - b[k]).abs().max().item() for k in a)
    assert moved > 1e-3 and apart < moved / 20, (moved, apart)


def test_policy_max_length_cuts_the_prompts_start_and_keeps_the_answer(micro_model_dir, reward_dir, tmp_path):
    """policy.max_length bounds prompt + answer: iterative DPO samples its answers to the end of a
    long multi-turn prompt (the last max_length - response_length tokens), and DPO trains on pairs
    whose prompts alone are longer than the limit (keep_end: the answers are what it learns from)."""
    from rlhf.models.loading import length_within

    rm_path, _ = reward_dir
    policy, tok = load_causal_lm(micro_model_dir, "cpu")
    limit = PolicySettings(**{**MICRO_POLICY.__dict__, "max_length": 48, "max_steps": 1, "batch_size": 2,
                              "pairs_per_prompt": 1, "min_pair_gap": 0.0, "samples_per_prompt": 2})
    assert length_within(limit.max_length, policy) == 48
    assert length_within(10**6, policy) == length_within(PolicySettings().max_length, policy)
    history = [{"role": "user", "content": "tell me about tea " * 30}, {"role": "assistant", "content": "tea " * 40}]
    long_prompts = [history + p for p in prompts(2)]
    metrics = train_iterative_dpo(micro_model_dir, rm_path, long_prompts, tmp_path / "idpo", limit, device="cpu")
    assert metrics["steps"] == 1 and metrics["sampled"]["answers"] == 4
    assert metrics["sampled"]["longest_prompt_tokens"] <= 48 - limit.response_length
    whole = PolicySettings(**{**limit.__dict__, "max_length": 0})
    metrics = train_iterative_dpo(micro_model_dir, rm_path, long_prompts, tmp_path / "whole", whole, device="cpu")
    assert metrics["sampled"]["longest_prompt_tokens"] > 48
    pairs = [{**p, "prompt": history + p["prompt"]} for p in clean_pairs(4, 5)]
    assert len(tok.apply_chat_template(pairs[0]["prompt"], tokenize=False)) > 48
    metrics = train_dpo(micro_model_dir, pairs, tmp_path / "dpo", limit, device="cpu")
    assert metrics["steps"] == 1 and metrics["train_loss"] > 0
