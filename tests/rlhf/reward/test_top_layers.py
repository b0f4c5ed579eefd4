"""The reward model trains only its top blocks when asked (``training.reward.trainable_layers``):
the blocks below and the embeddings stay exactly as the policy has them, and it still learns."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf.models.layers import train_top_layers, transformer_blocks
from rlhf.reward.training import train_reward_model
from rlhf.settings import RewardSettings
from tests.support.training import clean_pairs


def _tiny(family: str) -> torch.nn.Module:
    from transformers import GPT2Config, LlamaConfig
    if family == "gpt2":
        config = GPT2Config(n_layer=4, n_embd=16, n_head=2, vocab_size=64, n_positions=32)
    else:
        config = LlamaConfig(num_hidden_layers=4, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                             num_key_value_heads=1, vocab_size=64, max_position_embeddings=32)
    config.num_labels = 1
    return AutoModelForSequenceClassification.from_config(config)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_top_layers_freeze_everything_below(family):
    model = _tiny(family)
    blocks = transformer_blocks(model)
    assert blocks is not None and len(blocks) == 4
    everything = sum(p.numel() for p in model.parameters())

    info = train_top_layers(model, 2)
    assert info["trained_blocks"] == 2 and info["blocks"] == 4
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert all(p.requires_grad for b in list(blocks)[2:] for p in b.parameters())
    assert not any(p.requires_grad for b in list(blocks)[:2] for p in b.parameters())
    assert any(name.startswith("score") for name in trained)
    assert any(name.endswith(("norm.weight", "ln_f.weight")) and ".layers." not in name and ".h." not in name
               for name in trained)  # the final norm trains with the top block
    assert not any("embed" in name or "wte" in name or "wpe" in name for name in trained)
    assert 0 < info["trained_parameters"] < everything

    head_only = train_top_layers(model, 0)
    assert head_only["trained_blocks"] == 0 and head_only["trained_parameters"] < info["trained_parameters"]
    assert train_top_layers(model, -1)["trained_parameters"] == everything
    assert train_top_layers(model, 9)["trained_parameters"] == everything  # more than it has: all of them


def test_blocks_of_a_causal_lm_are_found_too():
    from transformers import LlamaConfig
    model = AutoModelForCausalLM.from_config(LlamaConfig(num_hidden_layers=3, hidden_size=16, intermediate_size=32,
                                                         num_attention_heads=2, num_key_value_heads=1,
                                                         vocab_size=64))
    assert train_top_layers(model, 1)["trained_blocks"] == 1
    assert model.lm_head.weight.requires_grad and not model.model.embed_tokens.weight.requires_grad


@pytest.mark.slow
def test_reward_model_with_its_lower_blocks_frozen_still_learns(micro_model_dir, tmp_path):
    out = tmp_path / "rm"
    metrics = train_reward_model(micro_model_dir, clean_pairs(200, 0), clean_pairs(50, 1), out,
                                 RewardSettings(epochs=8, learning_rate=2e-3, trainable_layers=1), device="cpu")
    assert metrics["trained_blocks"] == 1 and metrics["blocks"] > 1
    assert metrics["heldout_accuracy"] >= 0.8

    parent = AutoModelForSequenceClassification.from_pretrained(micro_model_dir, num_labels=1).state_dict()
    trained = AutoModelForSequenceClassification.from_pretrained(out).state_dict()
    blocks = transformer_blocks(AutoModelForSequenceClassification.from_pretrained(out))
    frozen = [k for k in parent if "score" not in k and k in trained]
    changed = [k for k in frozen if not torch.equal(parent[k], trained[k])]
    assert changed, "the top block trained"
    lowest = f".{len(blocks) - 1}."  # only the top block (and the final norm) may differ
    assert all(lowest in k or not any(f".{i}." in k for i in range(len(blocks))) for k in changed), changed
    assert not any("embed" in k or "wte" in k or "wpe" in k for k in changed)
