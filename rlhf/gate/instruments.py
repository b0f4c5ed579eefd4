"""The gate's two instruments and their tests.

* Held-out preference pairs: the DPO-style implicit reward margin of the candidate over its
  parent on each pair; what counts is its size, the mean margin's one-sided lower confidence bound
  against a minimum effect (``margin_effect``). The sign test (how many pairs went each way) is
  reported and tests a decline.
* The judge: a reward model trained on the held-out pairs only, trusted when it ranks training
  pairs better than a coin; its per-prompt gain on both models' answers goes to a signed-rank test.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from scipy.stats import binomtest, ttest_1samp, wilcoxon

from rlhf.data.datasets import to_standard
from rlhf.models.loading import length_within

# Implicit margins this close to zero (nats) are ties: the candidate does not separate the pair
# from the parent (a copy of the parent gives exactly 0; float noise on a GPU stays far below).
TIE_NATS = 1e-4
# Judge score differences this small are zeros: the same answer scored in another padded batch.
JUDGE_TIE = 1e-6


def fit_context(prompt: list[int], answer: list[int], context: int) -> tuple[list[int], list[int]]:
    """Prompt and answer ids cut to ``context`` positions: the prompt loses its start (one token
    at least stays, to predict the answer's first token), the answer its end only if it alone is
    too long."""
    answer = answer[: max(1, context - 1)]
    return prompt[-(context - len(answer)):], answer


def pair_sequences(tok: Any, pairs: list[dict], context: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) for each pair's chosen, then rejected answer: rendered with the chat
    template as training renders them (``to_standard``), prompt and answer tokenized separately as
    TRL's DPO does, so the answer ids are what the model would generate after the prompt. A rated
    pair's sides are rendered each with its own prompt."""
    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    out = []
    for row in pairs:
        if "chosen_prompt" in row:  # a rated pair (rlhf.data.datasets.rated_pairs): each side its own prompt
            for key in ("chosen", "rejected"):
                side = to_standard({"prompt": row[f"{key}_prompt"],
                                    "chosen": [{"role": "assistant", "content": row[key]}]}, tok)
                out.append(fit_context(ids(side["prompt"]), ids(side["chosen"]), context))
            continue
        std = to_standard(row, tok)
        prompt = ids(std["prompt"])
        out += [fit_context(prompt, ids(std[key]), context) for key in ("chosen", "rejected")]
    return out


@torch.no_grad()
def sequence_logprobs(model: Any, items: list[tuple[list[int], list[int]]], pad_id: int,
                      batch_size: int = 8) -> list[float]:
    """Sum of log p(answer token | everything before it) over each item's answer ids (right-padded
    batches; padding never changes a row's numbers beyond float noise)."""
    device = next(model.parameters()).device
    sums: list[float] = []
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        width = max(len(p) + len(a) for p, a in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        answer = torch.zeros(ids.shape, dtype=torch.bool)
        for row, (p, a) in enumerate(chunk):
            ids[row, :len(p) + len(a)] = torch.tensor(p + a)
            mask[row, :len(p) + len(a)] = 1
            answer[row, len(p):len(p) + len(a)] = True
        ids, mask, answer = ids.to(device), mask.to(device), answer.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        token_logp = logits.gather(2, ids[:, 1:, None]).squeeze(2) - torch.logsumexp(logits, dim=-1)
        sums.extend((token_logp * answer[:, 1:]).sum(1).tolist())
    return sums


def implicit_margins(candidate: Any, parent: Any, tok: Any, pairs: list[dict], max_length: int = 0) -> list[float]:
    """Per pair, the candidate's implicit reward margin with the parent as reference:
    ``[log pi_c(chosen) - log pi_p(chosen)] - [log pi_c(rejected) - log pi_p(rejected)]``, each answer
    read after the end of its prompt that fits ``max_length`` (rlhf.models.loading.length_within), as DPO
    trained on it."""
    if not pairs:
        return []
    seqs = pair_sequences(tok, pairs, length_within(max_length, candidate, parent))
    cand = sequence_logprobs(candidate, seqs, tok.pad_token_id)
    par = sequence_logprobs(parent, seqs, tok.pad_token_id)
    return [(cand[2 * i] - par[2 * i]) - (cand[2 * i + 1] - par[2 * i + 1]) for i in range(len(pairs))]


def sign_test(margins: list[float]) -> dict[str, Any]:
    """How often the candidate favours the chosen answer more than the parent does: wins
    (margin > 0), losses, ties (|margin| <= TIE_NATS, left out as a sign test leaves them out),
    the share of wins among the rest with its (two-sided) Wilson 95 % interval, and the one-sided
    binomial p-values for "better than a coin" (``p_value``) and "worse" (``p_worse``); both 1.0
    when every pair is a tie."""
    wins = sum(m > TIE_NATS for m in margins)
    losses = sum(m < -TIE_NATS for m in margins)
    decided = wins + losses
    out: dict[str, Any] = {"pairs": len(margins), "wins": wins, "losses": losses, "ties": len(margins) - decided,
                           "share": None, "ci95": [None, None], "p_value": 1.0, "p_worse": 1.0,
                           "mean_margin": round(sum(margins) / len(margins), 4) if margins else None}
    if decided:
        # the interval is two-sided (a one-sided test's proportion_ci would reach 1.0)
        ci = binomtest(wins, decided, 0.5).proportion_ci(confidence_level=0.95, method="wilson")
        out.update(share=round(wins / decided, 4), ci95=[round(float(ci.low), 4), round(float(ci.high), 4)],
                   p_value=four_digits(binomtest(wins, decided, 0.5, alternative="greater").pvalue),
                   p_worse=four_digits(binomtest(wins, decided, 0.5, alternative="less").pvalue))
    return out


def margin_effect(margins: list[float], min_margin: float, alpha: float) -> dict[str, Any]:
    """How far the candidate moved towards the preferred answers, not just which way: the mean
    implicit reward margin, its one-sided lower ``1 - alpha`` confidence bound (Student's t over the
    pairs, ties counted as the zeros they are) and the one-sided p-value of "the mean margin exceeds
    ``min_margin``" (``effect_p``, below ``alpha`` exactly when the bound is above the minimum).

    A sign test counts the direction of every margin however small: a candidate that shifts every
    likelihood by a hair in a direction the raters happen to share passes it with a tiny p-value
    (49 of 55 pairs, mean 0.18 nats, for a candidate no better than its parent). The bound asks
    for a shift of a size a real improvement makes (benchmarks/gate_false_pass.py)."""
    out: dict[str, Any] = {"min_margin": min_margin, "margin_low": None, "effect_p": 1.0}
    if len(margins) < 2:
        return out
    mean = sum(margins) / len(margins)
    if max(margins) - min(margins) <= TIE_NATS:  # no spread: the bound is the mean itself
        low, p_value = mean, (0.0 if mean > min_margin else 1.0)
    else:
        test = ttest_1samp(margins, popmean=min_margin, alternative="greater")
        low, p_value = float(test.confidence_interval(confidence_level=1 - alpha).low), float(test.pvalue)
    out.update(margin_low=round(low, 4) if math.isfinite(low) else None, effect_p=four_digits(p_value))
    return out


def heldout_summary(margins: list[float], min_margin: float, alpha: float) -> dict[str, Any]:
    """The held-out pairs' evidence as the gate reports and decides on it: the sign test's counts,
    share and p-values (``sign_test``) and the size of the shift (``margin_effect``)."""
    return {**sign_test(margins), **margin_effect(margins, min_margin, alpha)}


def four_digits(value: float) -> float:
    """A p-value as reported: four significant digits."""
    return float(f"{value:.4g}")


# ---------------------------------------------------------------------------- the judge

def judge_trust(accuracy: float | None, pairs: int | None, alpha: float) -> dict[str, Any]:
    """Whether the judge ranks pairs it never saw better than a coin (one-sided binomial test at
    ``alpha``): a judge that cannot is no evidence, whatever gain it reports."""
    if accuracy is None or not pairs:
        return {"trusted": False, "trust_p": None}
    p_value = binomtest(round(accuracy * pairs), pairs, 0.5, alternative="greater").pvalue
    return {"trusted": bool(p_value < alpha), "trust_p": four_digits(p_value)}


def paired_gain(parent: list[float], candidate: list[float], per_prompt: int, min_gain: float) -> dict[str, Any]:
    """The judge's gain, candidate minus parent, averaged per prompt first (both answered each
    prompt with the same sampling noise, so the differences are paired; a prompt's samples are not
    independent of each other), with one-sided Wilcoxon signed-rank p-values for "gain above
    ``min_gain``" (``p_value``: the evidence of an improvement), "any gain, above 0" (``p_any_gain``:
    whether the judge says flat) and "gain below 0" (``p_worse``). Signed ranks assume no normal
    scores and cannot reach a small p-value on a handful of prompts (six that all gain: 0.016)."""
    diffs = [sum(candidate[i:i + per_prompt]) / per_prompt - sum(parent[i:i + per_prompt]) / per_prompt
             for i in range(0, len(parent), per_prompt)]
    return {"gain": round(sum(diffs) / len(diffs), 4), "prompts": len(diffs), "min_gain": min_gain,
            "p_value": _signed_rank_p([d - min_gain for d in diffs], "greater"),
            "p_any_gain": _signed_rank_p(diffs, "greater"), "p_worse": _signed_rank_p(diffs, "less")}


def _signed_rank_p(values: list[float], alternative: str) -> float:
    """One-sided Wilcoxon signed-rank p-value; differences within float noise of 0 are zeros
    (left out), and 1.0 when nothing is left."""
    values = [v for v in values if abs(v) > JUDGE_TIE]
    return four_digits(wilcoxon(values, alternative=alternative).pvalue) if values else 1.0

