"""The evaluation gate: a candidate meets users only if it beats its parent offline.

On held-out prompts both models sample answers with the same settings; the run's reward model
scores them. The candidate passes when its mean reward is higher by at least
``min_reward_gain``, its KL from the parent stays below ``max_kl``, and it does not degenerate
(empty answers, repetition, loss of diversity).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from .loading import load_causal_lm, resolve_device
from .reward_model import context_length, load_reward_model, score_texts
from .progress import ProgressFn
from .settings import EvalSettings, GateThresholds


def repetition(text: str) -> float:
    words = text.split()
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    if not grams:
        return 0.0
    return 1 - len(set(grams)) / len(grams)


def distinct_n(texts: list[str], n: int = 2) -> float:
    grams = Counter(tuple(w[i:i + n]) for w in (t.split() for t in texts) for i in range(len(w) - n + 1))
    total = sum(grams.values())
    return len(grams) / total if total else 0.0


@torch.no_grad()
def _sample(model: Any, tok: Any, prompts: list[str], settings: EvalSettings) -> tuple[list[str], list[list[int]], list[list[int]]]:
    """Answers (text), prompt ids and answer ids (up to and including EOS)."""
    texts, prompt_ids, answer_ids = [], [], []
    device = next(model.parameters()).device
    # a long conversation keeps its end: prompt + answer must fit the model's positions
    budget = max(8, context_length(model) - settings.max_new_tokens)
    side, tok.truncation_side = tok.truncation_side, "left"
    try:
        encoded = [tok(prompts[i:i + 16], return_tensors="pt", padding=True, add_special_tokens=False,
                       truncation=True, max_length=budget) for i in range(0, len(prompts), 16)]
    finally:
        tok.truncation_side = side
    for enc in encoded:
        enc = enc.to(device)
        out = model.generate(**enc, max_new_tokens=settings.max_new_tokens, do_sample=True,
                             temperature=settings.temperature, top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
        width = enc["input_ids"].shape[1]
        for row, mask, gen in zip(enc["input_ids"], enc["attention_mask"], out[:, width:]):
            ids = gen.tolist()
            if tok.eos_token_id in ids:
                ids = ids[: ids.index(tok.eos_token_id) + 1]
            ids = [t for t in ids if t != tok.pad_token_id]
            prompt_ids.append(row[mask.bool()].tolist())
            answer_ids.append(ids)
            texts.append(tok.decode(ids, skip_special_tokens=True).split("\nUser:")[0].strip())
    return texts, prompt_ids, answer_ids


@torch.no_grad()
def _logprob(model: Any, prompt_ids: list[int], answer_ids: list[int]) -> float:
    if not answer_ids:
        return 0.0
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + answer_ids], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(answer_ids, device=device)[:, None]).sum().item()


def _summary(texts: list[str], rewards: list[float]) -> dict[str, float]:
    n = max(1, len(texts))
    return {"mean_reward": sum(rewards) / max(1, len(rewards)),
            "empty_rate": sum(1 for t in texts if not t) / n,
            "repetition": sum(repetition(t) for t in texts) / n,
            "distinct2": distinct_n(texts, 2),
            "mean_words": sum(len(t.split()) for t in texts) / n}


def evaluate_candidate(candidate_dir: str | Path, parent_dir: str | Path, reward_dir: str | Path,
                       prompts: list[list[dict]], thresholds: GateThresholds = GateThresholds(),
                       settings: EvalSettings = EvalSettings(), device: str = "auto",
                       progress: ProgressFn | None = None) -> dict[str, Any]:
    """Compare candidate and parent on ``prompts``; returns metrics, ``passed`` and ``reasons``."""
    dev = resolve_device(device)
    candidate, tok = load_causal_lm(candidate_dir, dev)
    parent, _ = load_causal_lm(parent_dir, dev)
    reward, reward_tok = load_reward_model(reward_dir, dev)
    prompt_texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                    for p in prompts[: settings.max_prompts]]
    prompt_texts = [t for t in prompt_texts for _ in range(settings.samples_per_prompt)]
    if not prompt_texts:
        raise ValueError("no prompts to evaluate on")
    report = progress or (lambda *a: None)

    results = {}
    for step, (name, model) in enumerate((("parent", parent), ("candidate", candidate))):
        torch.manual_seed(settings.seed)  # same sampling noise for both
        texts, p_ids, a_ids = _sample(model, tok, prompt_texts, settings)
        rewards = score_texts(reward, reward_tok, [p + " " + t + tok.eos_token if t else p + tok.eos_token
                                                   for p, t in zip(prompt_texts, texts)])
        results[name] = (texts, p_ids, a_ids, rewards)
        report("evaluate", step + 1, 3)

    texts, p_ids, a_ids, _ = results["candidate"]
    kl = sum(_logprob(candidate, p, a) - _logprob(parent, p, a) for p, a in zip(p_ids, a_ids)) / len(a_ids)
    report("evaluate", 3, 3)

    parent_summary = _summary(results["parent"][0], results["parent"][3])
    cand_summary = _summary(texts, results["candidate"][3])
    gain = cand_summary["mean_reward"] - parent_summary["mean_reward"]
    reasons = []
    if gain <= thresholds.min_reward_gain:
        reasons.append(f"mean reward gain {gain:.3f} is not above {thresholds.min_reward_gain}")
    if kl > thresholds.max_kl:
        reasons.append(f"KL from parent {kl:.2f} exceeds {thresholds.max_kl}")
    if cand_summary["empty_rate"] > thresholds.max_empty_rate:
        reasons.append(f"empty answers {cand_summary['empty_rate']:.0%} exceed {thresholds.max_empty_rate:.0%}")
    if cand_summary["repetition"] > thresholds.max_repetition:
        reasons.append(f"repetition {cand_summary['repetition']:.2f} exceeds {thresholds.max_repetition}")
    if parent_summary["distinct2"] and \
            cand_summary["distinct2"] < thresholds.min_distinct2_ratio * parent_summary["distinct2"]:
        reasons.append(f"distinct-2 fell to {cand_summary['distinct2']:.3f} "
                       f"(parent {parent_summary['distinct2']:.3f})")
    rnd = lambda d: {k: round(v, 4) for k, v in d.items()}  # noqa: E731
    return {"passed": not reasons, "reasons": reasons, "prompts": len(prompt_texts) // settings.samples_per_prompt,
            "samples": len(prompt_texts), "parent": rnd(parent_summary), "candidate": rnd(cand_summary),
            "reward_gain": round(gain, 4), "kl_from_parent": round(kl, 4), "thresholds": asdict(thresholds),
            "examples": [{"prompt": prompts[i // settings.samples_per_prompt][-1]["content"],
                          "parent": results["parent"][0][i], "candidate": texts[i]}
                         for i in range(0, min(len(texts), 6 * settings.samples_per_prompt),
                                        settings.samples_per_prompt)]}
