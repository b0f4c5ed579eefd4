"""Reading a reward model: load it, find its context length, score texts with it.

The reward is read at each text's last token (TRL's convention), so over-long texts lose their
start, never their end. Training lives in rlhf.reward.training; the criterion heads in
rlhf.reward.criteria_heads, which scores through these functions.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlhf.models.loading import context_length


def load_reward_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[Any, Any]:
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    return model.to(device).eval(), tok


@torch.no_grad()
def score_texts(model: Any, tokenizer: Any, texts: list[str], batch_size: int = 32) -> list[float]:
    """Reward of each full text (prompt + completion ending with EOS). Over-long texts lose
    their start, never their end (the reward is read at the last token)."""
    scores: list[float] = []
    device = next(model.parameters()).device
    side = tokenizer.truncation_side
    tokenizer.truncation_side = "left"
    try:
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True, truncation=True,
                            max_length=context_length(model), add_special_tokens=False).to(device)
            scores.extend(model(**enc).logits.squeeze(-1).float().tolist())
    finally:
        tokenizer.truncation_side = side
    return scores


def pairwise_accuracy(model: Any, tokenizer: Any, rows: list[dict]) -> float | None:
    """Share of standard-format pairs whose chosen text scores above the rejected one."""
    if not rows:
        return None
    chosen = score_texts(model, tokenizer, [r["prompt"] + r["chosen"] for r in rows])
    rejected = score_texts(model, tokenizer, [r["prompt"] + r["rejected"] for r in rows])
    return sum(c > r for c, r in zip(chosen, rejected)) / len(rows)
