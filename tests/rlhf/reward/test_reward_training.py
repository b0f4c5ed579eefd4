"""TRL's reward trainer on the micro model: a clean preference, and rated pairs across questions alone."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rlhf.reward.scoring import load_reward_model, score_texts
from rlhf.reward.training import train_reward_model
from rlhf.settings import RewardSettings
from tests.support.training import clean_pairs

pytestmark = pytest.mark.slow


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


def test_reward_model_learns_from_rated_pairs_across_questions_alone(micro_model_dir, tmp_path):
    """No two answers to the same question: every pair's sides have their own prompts (rated pairs,
    rlhf.data.datasets.rated_pairs). The reward model still learns the preference."""
    rows = [{"chosen_prompt": p["prompt"], "chosen": p["chosen"][0]["content"], "rejected_prompt": q["prompt"],
             "rejected": q["rejected"][0]["content"], "margin": 1.0, "source": "rated"}
            for p, q in zip(clean_pairs(150, 3), clean_pairs(150, 4))]
    metrics = train_reward_model(micro_model_dir, [], clean_pairs(40, 5), tmp_path / "rm",
                                 RewardSettings(epochs=6, learning_rate=2e-3), device="cpu", rated_rows=rows)
    assert metrics["train_pairs"] == 0 and metrics["rated_pairs"] == 150
    assert metrics["heldout_accuracy"] >= 0.8  # same-question held-out pairs it never saw




def test_a_reward_model_reads_texts_as_long_as_it_was_trained_on(micro_model_dir, tmp_path):
    """Trained on 48-token windows, it scores a longer text as it was trained: by its last 48 tokens
    (the saved length, not the model's 128 positions), wherever it is read (gate, trainers, metrics)."""
    from rlhf.reward.scoring import reading_length

    train_reward_model(micro_model_dir, clean_pairs(16, 0), [], tmp_path / "rm",
                       RewardSettings(max_length=48, max_steps=2), device="cpu")
    model, tok = load_reward_model(tmp_path / "rm")
    assert reading_length(model) == 48
    text = "User: How do I cook rice? " * 3 + "\nAssistant: Sure! Rinse the rice. Hope that helps!<|endoftext|>"
    ids = tok(text, add_special_tokens=False)["input_ids"][-100:]
    text = tok.decode(ids)
    assert 48 < len(ids) <= 128
    whole, window, other = score_texts(model, tok, [text, tok.decode(ids[-48:]), tok.decode(ids[-60:])])
    assert whole == pytest.approx(window, abs=1e-5) and other == pytest.approx(window, abs=1e-5)
