"""Which weights of a transformer train: all of them, or only its top blocks and its head.

A reward model read from a pretrained chat model already holds features that tell answers apart;
retraining all of them on a few dozen pairs costs the most time per step and overfits first (on
SmolLM2-135M at the old defaults: training accuracy 1.00, held-out 0.42, 26 minutes). Freezing the
embeddings and the lower blocks keeps those features and makes a step cheaper: no gradients are
computed below the lowest trained block. ``benchmarks/real_model_reward.py`` measures what each
choice costs and buys.
"""
from __future__ import annotations

from typing import Any

import torch


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's stack of transformer blocks: its largest ``ModuleList`` (``model.layers`` in
    Llama, Mistral and Phi; ``transformer.h`` in GPT-2), or None for a model without one."""
    best: torch.nn.ModuleList | None = None
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0 and (best is None or len(module) > len(best)):
            best = module
    return best


def final_norm(model: torch.nn.Module) -> torch.nn.Module | None:
    """The norm between the blocks and the head (``model.norm`` in Llama, ``transformer.ln_f`` in GPT-2),
    or None."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    for name in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
        module = getattr(base, name, None) if base is not None else None
        if isinstance(module, torch.nn.Module):
            return module
    return None


def _head_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules above the blocks that must train with them: the score (or LM) head and the final norm."""
    out: list[torch.nn.Module] = [getattr(model, name) for name in ("score", "lm_head", "classifier")
                                  if isinstance(getattr(model, name, None), torch.nn.Module)]
    norm = final_norm(model)
    return out + ([norm] if norm is not None else [])


def train_top_layers(model: torch.nn.Module, n: int) -> dict[str, Any]:
    """Freeze every weight of ``model`` but its top ``n`` transformer blocks, its final norm and its
    head (``n = 0``: the head and the final norm only; ``n < 0`` or at least the number of blocks:
    everything trains, as before). Returns what trains: ``trained_blocks``, ``blocks`` and
    ``trained_parameters``. A model whose blocks cannot be found trains fully."""
    blocks = transformer_blocks(model)
    count = len(blocks) if blocks is not None else 0
    if n < 0 or blocks is None or n >= count:
        for p in model.parameters():
            p.requires_grad_(True)
        return {"trained_blocks": count, "blocks": count,
                "trained_parameters": sum(p.numel() for p in model.parameters())}
    for p in model.parameters():
        p.requires_grad_(False)
    for module in [*list(blocks)[count - n:], *_head_modules(model)]:
        for p in module.parameters():
            p.requires_grad_(True)
    return {"trained_blocks": n, "blocks": count,
            "trained_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
