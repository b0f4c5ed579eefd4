"""Compute a frozen bottom once per sequence: the features below the lowest trained block, cached.

With ``training.reward.trainable_layers`` at ``n >= 0`` (rlhf.models.layers), the embeddings and the
lower blocks are frozen: every training step would compute the same hidden states for the same
answer again, and on a real model that forward pass is most of a step (SmolLM2-135M, 32 sequences of
150 tokens: 21 s of a 25.7 s step with the top 2 blocks trained, 20.4 s of head-only's). The reward
model sees each pair once per epoch, so the cache pays from the second epoch on.

``FrozenFeatureCache`` is a context manager around training: while it is open the model's block
list holds only the trained blocks, and a forward pre-hook on the first trained module (the lowest
trained block, or the final norm when only the head trains) hands it the cached input of that module
for each row of the batch, computed on a row's first sight by the full model under ``no_grad`` and
in eval mode (dropout in the frozen blocks, where a model has any, is off: a frozen feature is the
same on every sight).
Rows are keyed by their real tokens (the attention mask's ones; right padding, as TRL's preference
collator pads), and with causal attention a token's features do not depend on the padding after it,
so the cached forward equals the full one (tests/rlhf/reward/test_frozen_features.py checks the
logits). On exit the blocks are put back as they were, before anything saves the model.
"""
from __future__ import annotations

from typing import Any

import torch

from rlhf.models.layers import final_norm, transformer_blocks


def _owner(model: torch.nn.Module, target: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """The module holding ``target`` as an attribute, and the attribute's name."""
    for module in model.modules():
        for name, child in module.named_children():
            if child is target:
                return module, name
    raise ValueError("the block list is not an attribute of any module")


class FrozenFeatureCache:
    """Skip ``model``'s frozen bottom while open: see the module's docstring. ``trained_blocks``: how many
    top blocks train (as ``train_top_layers`` got it, 0 to len(blocks) - 1). ``max_bytes``: a limit on the
    cache (kept in host memory); past it new rows are no longer cached but computed each time."""

    def __init__(self, model: torch.nn.Module, trained_blocks: int, max_bytes: int = 4 << 30) -> None:
        blocks = transformer_blocks(model)
        if blocks is None or not 0 <= trained_blocks < len(blocks):
            raise ValueError(f"nothing frozen to cache: {trained_blocks} trained blocks of "
                             f"{0 if blocks is None else len(blocks)}")
        self.model, self.blocks, self.frozen = model, blocks, len(blocks) - trained_blocks
        self.first = blocks[self.frozen] if trained_blocks else self._final_norm()
        self.owner, self.attr = _owner(model, blocks)
        self.max_bytes, self.bytes = max_bytes, 0
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}
        self.hits = self.misses = 0
        self._batch: torch.Tensor | None = None
        self._hooks: list[Any] = []

    def _final_norm(self) -> torch.nn.Module:
        norm = final_norm(self.model)
        if norm is None:
            raise ValueError("head-only training needs a final norm to hand the cached features to")
        return norm

    # -------------------------------------------------------------------------------- hooks
    def _features(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The first trained module's input for each row: cached, or computed now by the full model."""
        lengths = mask.sum(dim=1).tolist()
        keys = [tuple(row[:n].tolist()) for row, n in zip(input_ids, lengths)]
        missing = [i for i, k in enumerate(keys) if k not in self.cache]
        fresh = dict(zip(missing, self._compute(input_ids[missing], mask[missing]))) if missing else {}
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        rows = []
        for i, (key, n) in enumerate(zip(keys, lengths)):
            feats = fresh[i][:n] if i in fresh else self.cache[key]
            if i in fresh and key not in self.cache and self.bytes < self.max_bytes:  # a row twice in a batch: once
                self.cache[key] = feats.clone()
                self.bytes += feats.numel() * feats.element_size()
            rows.append(feats)
        out = torch.zeros((len(rows), input_ids.shape[1], rows[0].shape[-1]), dtype=rows[0].dtype)
        for i, (feats, n) in enumerate(zip(rows, lengths)):
            out[i, :n] = feats
        return out

    def _compute(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Run the full model (blocks restored for the call) and keep the first trained module's input."""
        seen: list[torch.Tensor] = []

        def grab(_module: Any, args: tuple, kwargs: dict) -> None:
            seen.append((args[0] if args else kwargs["hidden_states"]).detach().cpu())

        setattr(self.owner, self.attr, self.blocks)
        self._close_hooks()
        handle = self.first.register_forward_pre_hook(grab, with_kwargs=True)
        training = self.model.training
        self.model.eval()  # the frozen features without dropout: the same on every sight
        try:
            with torch.no_grad():
                self.model(input_ids=input_ids, attention_mask=mask, use_cache=False)
        finally:
            handle.remove()
            self.model.train(training)
            self._open_hooks()
        return seen[0]

    def _on_model(self, _module: Any, args: tuple, kwargs: dict) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            raise ValueError("FrozenFeatureCache needs the model called with input_ids")
        mask = kwargs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(input_ids)
        if not bool((mask[:, 1:] <= mask[:, :-1]).all()):
            raise ValueError("FrozenFeatureCache needs right padding (the attention mask's ones first)")
        self._batch = self._features(input_ids, mask)

    def _on_first(self, _module: Any, args: tuple, kwargs: dict) -> Any:
        if self._batch is None:
            return None
        feats, self._batch = self._batch, None
        ref = args[0] if args else kwargs["hidden_states"]
        feats = feats.to(device=ref.device, dtype=ref.dtype)
        return ((feats, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": feats})

    def _open_hooks(self) -> None:
        setattr(self.owner, self.attr, torch.nn.ModuleList(list(self.blocks)[self.frozen:]))
        self._hooks = [self.model.register_forward_pre_hook(self._on_model, with_kwargs=True),
                       self.first.register_forward_pre_hook(self._on_first, with_kwargs=True)]

    def _close_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # ---------------------------------------------------------------------------- context
    def __enter__(self) -> FrozenFeatureCache:
        self._open_hooks()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close_hooks()
        setattr(self.owner, self.attr, self.blocks)
        self._batch = None

    def stats(self) -> dict[str, Any]:
        """What the cache did: rows computed (misses) and reused (hits), and its size in MB."""
        return {"cached_rows": len(self.cache), "hits": self.hits, "misses": self.misses,
                "cache_mb": round(self.bytes / 2 ** 20, 1)}

