"""Sampling answers the way serving does, for the gate and the online trainers.

Answers stop at EOS or the chat template's end-of-turn token and are cut where the model began a
new turn, as the chat server cuts them, so what the gate and the trainers score is what users see.
The temperature and nucleus (``top_p``) are the settings' own; the app passes the server's
(webapp.training.runner), since the tail nucleus sampling cuts is where a small model's worst
answers are: SmolLM2's answers were lists 15.6 % of the time at top_p 1.0, 39.3 % at the served 0.95.
"""
from __future__ import annotations

from typing import Any

import torch

from rlhf.models.chat_format import end_ids, turn_markers
from rlhf.models.loading import answer_length, context_length
from rlhf.settings import EvalSettings

# answers generated at once. Each generate call runs until its longest answer ends (a real model's
# usually runs to the limit), so fewer, larger calls do the same work in fewer steps: SmolLM2 sampled
# 48 answers of 128 tokens at 64 rows in 0.76x the time at 16 after one-question prompts, 0.94x after
# 3-turn chats (benchmarks/generation_batch.py, top_p 0.95, 2 threads)
GENERATE_ROWS = 64


@torch.no_grad()
def sample_answers(model: Any, tok: Any, prompts: list[str],
                   settings: EvalSettings) -> tuple[list[str], list[list[int]], list[list[int]]]:
    """Answers (text), prompt ids and answer ids (up to and including EOS or the end-of-turn token)."""
    texts, prompt_ids, answer_ids = [], [], []
    ends = end_ids(tok)  # EOS and the template's end-of-turn token (Llama-3's <|eot_id|> is not EOS)
    stops = turn_markers(tok)[0]
    device = next(model.parameters()).device
    # a long conversation keeps its end: prompt + answer must fit the model's positions
    new_tokens = answer_length(model, settings.max_new_tokens)
    budget = context_length(model) - new_tokens
    side, tok.truncation_side = tok.truncation_side, "left"
    try:
        encoded = [tok(prompts[i:i + GENERATE_ROWS], return_tensors="pt", padding=True, add_special_tokens=False,
                       truncation=True, max_length=budget) for i in range(0, len(prompts), GENERATE_ROWS)]
    finally:
        tok.truncation_side = side
    for enc in encoded:
        enc = enc.to(device)
        out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=True, temperature=settings.temperature,
                             top_p=settings.top_p, top_k=0, pad_token_id=tok.pad_token_id, eos_token_id=ends)
        width = enc["input_ids"].shape[1]
        for row, mask, gen in zip(enc["input_ids"], enc["attention_mask"], out[:, width:]):
            ids = gen.tolist()
            stop = next((i for i, t in enumerate(ids) if t in ends), None)
            if stop is not None:
                ids = ids[: stop + 1]
            ids = [t for t in ids if t != tok.pad_token_id]
            prompt_ids.append(row[mask.bool()].tolist())
            answer_ids.append(ids)
            text = tok.decode(ids, skip_special_tokens=True)
            for stop in stops:  # where the model began a new turn, as serving cuts it (not only "\nUser:")
                text = text.split(stop)[0]
            texts.append(text.strip())
    return texts, prompt_ids, answer_ids


@torch.no_grad()
def answer_logprob(model: Any, prompt_ids: list[int], answer_ids: list[int]) -> float:
    if not answer_ids:
        return 0.0
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + answer_ids], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(answer_ids, device=device)[:, None]).sum().item()

