"""The frozen bottom's features are computed once per sequence (rlhf.models.frozen_features): the
cached forward gives the full model's logits and gradients, each sequence is computed once however
many batches it comes back in, and the model is whole again after."""
from __future__ import annotations

import pytest
import torch

from rlhf.models.frozen_features import FrozenFeatureCache
from rlhf.models.layers import train_top_layers, transformer_blocks
from tests.rlhf.reward.test_top_layers import _tiny


def _batch(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded, as TRL's preference collator pads."""
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


ROWS = [[5, 9, 11, 3, 7, 2], [4, 4, 8], [12, 13, 14, 15, 16, 17, 18, 19, 20], [6, 1]]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("trained", [0, 1, 3])
def test_the_cached_forward_equals_the_full_one(family, trained):
    torch.manual_seed(0)
    model = _tiny(family).eval()
    model.config.pad_token_id = 0
    train_top_layers(model, trained)
    ids, mask = _batch(ROWS, 0)
    full = model(input_ids=ids, attention_mask=mask).logits
    full.sum().backward()
    full_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()

    blocks = transformer_blocks(model)
    with FrozenFeatureCache(model, trained) as cache:
        assert len(getattr(cache.owner, cache.attr)) == trained  # the frozen blocks are skipped
        first = model(input_ids=ids, attention_mask=mask).logits          # computes every row
        # the same rows again, reordered and padded wider: all from the cache
        order = [2, 0, 3, 1]
        again_ids, again_mask = _batch([ROWS[i] for i in order] + [[30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]], 0)
        again = model(input_ids=again_ids, attention_mask=again_mask).logits
        first.sum().backward()
        stats = cache.stats()
    assert torch.allclose(first, full, atol=1e-5)
    assert torch.allclose(again[:4], full[order], atol=1e-5)
    assert stats["misses"] == 5 and stats["hits"] == 4 and stats["cached_rows"] == 5
    for name, grad in full_grads.items():  # the trained weights get the same gradients
        assert torch.allclose(dict(model.named_parameters())[name].grad, grad, atol=1e-5), name
    assert transformer_blocks(model) is blocks and len(blocks) == 4  # whole again
    assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, full, atol=1e-6)


def test_nothing_frozen_or_left_padding_is_refused():
    model = _tiny("llama")
    with pytest.raises(ValueError, match="nothing frozen"):
        FrozenFeatureCache(model, 4)
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    with FrozenFeatureCache(model, 1), pytest.raises(ValueError, match="right padding"):
        model(input_ids=ids, attention_mask=mask)
    assert len(transformer_blocks(model)) == 4
