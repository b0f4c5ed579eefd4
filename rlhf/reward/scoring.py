"""Reading a reward model: render answers as it reads them, load it, score texts with it.

``reward_texts`` is the one rendering of an answer as the reward model reads it: every scorer
(criterion heads, the gate and its judge, RLOO, iterative DPO, the experiments' metrics) renders
through it, so what is scored is exactly what the reward model was trained on. The reward is read
at each text's last token (TRL's convention), so over-long texts lose their start, never their
end, and no text is read longer than the reward model was trained on (``reading_length``: a
100 M-parameter model trained on 256-token windows was otherwise read over whole multi-turn
histories, up to its 8,192 positions: text it never saw). Training lives in rlhf.reward.training;
the criterion heads in rlhf.reward.criteria_heads, which scores through these functions.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlhf.data.datasets import to_standard
from rlhf.models.loading import context_length

# the config key a trained reward model keeps its training length under (rlhf.reward.training saves it)
TRAINED_LENGTH_KEY = "rlhf_max_length"


def reading_length(model: Any) -> int:
    """The most tokens ``model`` reads of a text: what it was trained on (``TRAINED_LENGTH_KEY``),
    within its context; a model saved without it (before training wrote it) reads its context."""
    context = context_length(model)
    trained = getattr(model.config, TRAINED_LENGTH_KEY, None)
    return min(context, trained) if isinstance(trained, int) and trained > 0 else context


def reward_texts(tokenizer: Any, histories: list[list[dict[str, str]]], answers: list[str]) -> list[str]:
    """The one rendering of an answer as the reward model reads it: each answer after its
    conversation (``histories``: the messages before it), rendered by ``tokenizer``'s chat template
    exactly as the reward model's training texts are (``rlhf.data.datasets.to_standard``: the prompt
    through the generation prompt, then the answer as the template writes it, ending with the
    end-of-turn token or EOS), so ``reward_texts(tok, [h], [a])`` is the training text of the pair
    (h, a). An answer is its text as stored and shown (a sampled one: what the policy generated after
    the generation prompt, stripped as serving strips it); an empty answer renders as the template
    writes an empty turn."""
    out = []
    for history, answer in zip(histories, answers, strict=True):
        row = to_standard({"prompt": list(history), "completion": [{"role": "assistant", "content": answer}]},
                          tokenizer)
        out.append(row["prompt"] + row["completion"])
    return out


def load_reward_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[Any, Any]:
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    return model.to(device).eval(), tok


@torch.no_grad()
def score_texts(model: Any, tokenizer: Any, texts: list[str], batch_size: int = 32) -> list[float]:
    """Reward of each full text (prompt + completion ending with EOS). Texts over the model's
    ``reading_length`` lose their start, never their end (the reward is read at the last token)."""
    scores: list[float] = []
    device = next(model.parameters()).device
    side = tokenizer.truncation_side
    tokenizer.truncation_side = "left"
    try:
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True, truncation=True,
                            max_length=reading_length(model), add_special_tokens=False).to(device)
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
