"""The evaluation gate: a candidate meets users only if evidence its training never saw says
it beats its parent.

Two instruments, neither of which the policy was optimized on:

* **held-out preference pairs** (split by conversation; neither the run's reward model nor the
  policy saw them): the DPO-style implicit reward margin with the parent as reference,
  ``delta = [log pi_c(chosen) - log pi_p(chosen)] - [log pi_c(rejected) - log pi_p(rejected)]``
  (summed answer-token log-probabilities given the prompt, rendered with the chat template),
  counted only above a minimum effect: the mean margin's one-sided lower confidence bound must
  exceed ``min_margin`` nats (the sign test is reported and tests a decline);
* a **judge reward model** trained on those held-out pairs only (``rlhf.cycle``), scoring both
  models' answers to held-out prompts (signed-rank test of its per-prompt gain). It counts only if
  it ranks training pairs, which it never saw, better than a coin.

The candidate passes when the instruments' one-sided p-values, combined by Simes' test, fall
below ``alpha``, neither shows a decline at ``alpha``, a trusted judge does not call it flat (the
pairs alone cannot outvote it; rlhf.gate.verdict), and the KL and degeneration checks hold. The run's own reward model
(the one PPO/RLOO optimized against) scores the same answers; its gain is reported, labelled as
such, and never decides: the policy was trained to raise exactly that number. With fewer than
``min_heldout_pairs`` held-out pairs the verdict is "not enough evidence" and the candidate is
not passed.
"""
from __future__ import annotations

import gc
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rlhf.data.criteria import SAFETY
from rlhf.gate.instruments import (
    fit_context,
    heldout_summary,
    implicit_margins,
    judge_trust,
    paired_gain,
    sequence_logprobs,
)
from rlhf.gate.verdict import decided_by, evidence_p, evidence_reasons, judged_by, simes  # noqa: F401 (simes: part of the gate's API)
from rlhf.models.loading import length_within, load_causal_lm, resolve_device
from rlhf.models.sampling import sample_answers
from rlhf.policy.common import prompt_text_within
from rlhf.progress import ProgressFn
from rlhf.reward.criteria_heads import CriteriaScorer
from rlhf.reward.scoring import load_reward_model, reward_texts, score_texts
from rlhf.settings import EvalSettings, GateThresholds

PASSED, REJECTED, NOT_ENOUGH_EVIDENCE = "passed", "rejected", "not enough evidence"


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



def _summary(texts: list[str], rewards: list[float], judge_rewards: list[float] | None = None) -> dict[str, float]:
    n = max(1, len(texts))
    out = {"mean_reward": sum(rewards) / max(1, len(rewards)),
           "empty_rate": sum(1 for t in texts if not t) / n,
           "repetition": sum(repetition(t) for t in texts) / n,
           "distinct2": distinct_n(texts, 2),
           "mean_words": sum(len(t.split()) for t in texts) / n}
    if judge_rewards is not None:
        out["judge_reward"] = sum(judge_rewards) / max(1, len(judge_rewards))
    return out


def _scores(reward_dir: str | Path, device: torch.device, histories: list[list[dict]],
            answers: dict[str, list[str]]) -> dict[str, list[float]]:
    """Each model's answers (after their conversations, ``histories``) scored by the reward model in
    ``reward_dir`` (loaded, used, released), rendered as it was trained (``reward_texts``)."""
    reward, reward_tok = load_reward_model(reward_dir, device)
    scores = {name: score_texts(reward, reward_tok, reward_texts(reward_tok, histories, texts))
              for name, texts in answers.items()}
    del reward
    gc.collect()
    return scores



def _first_askings(prompt_texts: list[str], per_prompt: int) -> list[int]:
    """Indices of the samples of each prompt's first asking (``prompt_texts`` holds every prompt
    ``per_prompt`` times in a row; a prompt repeated for the judge appears again later)."""
    seen: set[str] = set()
    out: list[int] = []
    for start in range(0, len(prompt_texts), per_prompt):
        if prompt_texts[start] not in seen:
            seen.add(prompt_texts[start])
            out.extend(range(start, start + per_prompt))
    return out


# ---------------------------------------------------------------------------- the checks

def criteria_scores(reward_dir: str | Path, device: torch.device, histories: list[list[dict]],
                    answers: dict[str, list[str]]) -> dict[str, Any] | None:
    """Each criterion's mean score of each model's answers (after their conversations,
    ``histories``), by the run's reward model's criterion heads, and the safety head's flag risk;
    None without heads."""
    scorer = CriteriaScorer.load(reward_dir, device)
    if scorer is None:
        return None
    scores = {name: scorer.score_answers(histories, a) for name, a in answers.items()}
    out: dict[str, Any] = {"criteria": {c: {name: round(sum(s[c]) / max(1, len(s[c])), 4) for name, s in scores.items()}
                                        for c in scorer.names}}
    if scorer.has_safety:
        risk = {name: scorer.risk_of_costs(s[SAFETY]) for name, s in scores.items()}
        means = {name: sum(r) / max(1, len(r)) for name, r in risk.items()}
        out["flag_risk"] = {**{name: round(v, 4) for name, v in means.items()},
                            "increase": round(means["candidate"] - means["parent"], 4)}
    del scorer
    gc.collect()
    return out


def safety_reasons(kl: float, parent: dict[str, float], cand: dict[str, float], t: GateThresholds,
                   flag_risk: dict[str, float] | None = None) -> list[str]:
    """KL from the parent, degeneration and the predicted flag rate: what a candidate must never do,
    whatever the evidence."""
    reasons = []
    if flag_risk is not None and flag_risk["increase"] > t.max_flag_risk_increase:
        reasons.append(f"predicted flag rate rose from {flag_risk['parent']:.1%} to {flag_risk['candidate']:.1%}, "
                       f"more than {t.max_flag_risk_increase:.1%} (safety head)")
    if kl > t.max_kl:
        reasons.append(f"KL from parent {kl:.2f} exceeds {t.max_kl}")
    if cand["empty_rate"] > t.max_empty_rate:
        reasons.append(f"empty answers {cand['empty_rate']:.0%} exceed {t.max_empty_rate:.0%}")
    if cand["repetition"] > t.max_repetition:
        reasons.append(f"repetition {cand['repetition']:.2f} exceeds {t.max_repetition}")
    if parent["distinct2"] and cand["distinct2"] < t.min_distinct2_ratio * parent["distinct2"]:
        reasons.append(f"distinct-2 fell to {cand['distinct2']:.3f} (parent {parent['distinct2']:.3f})")
    return reasons


# ---------------------------------------------------------------------------- the gate

def evaluate_candidate(candidate_dir: str | Path, parent_dir: str | Path, reward_dir: str | Path,
                       prompts: list[list[dict]], thresholds: GateThresholds = GateThresholds(),
                       settings: EvalSettings = EvalSettings(), device: str = "auto",
                       progress: ProgressFn | None = None, heldout_pairs: list[dict] | None = None,
                       judge_dir: str | Path | None = None, judge_info: dict[str, Any] | None = None,
                       judged_prompts: int | None = None, max_length: int = 0) -> dict[str, Any]:
    """Compare candidate and parent; returns the evidence, ``passed``, ``verdict`` and ``reasons``.

    ``heldout_pairs``: preference pairs (conversational rows) neither model nor ``reward_dir``
    trained on; ``judge_dir``: a reward model trained on them alone (``judge_info``: how it was
    trained, reported with it); ``judged_prompts``: how many of the first ``prompts`` the judge's
    gain is measured on (None: all), the others serving the KL and degeneration checks only.
    ``reward_dir``: the run's own reward model, whose gain is reported and never decides.
    ``max_length``: the tokens of prompt + answer the policy trained on (0: the context); the gate
    samples after, and reads the KL and the held-out pairs within, the same end of each prompt
    (SmolLM2's whole 3-turn histories took 354 s for 107 pairs)."""
    dev = resolve_device(device)
    candidate, tok = load_causal_lm(candidate_dir, dev)
    parent, _ = load_causal_lm(parent_dir, dev)
    # each conversation once per sample: the sampler reads its rendered text, the scorers the conversation
    histories = [p for p in prompts[: settings.max_prompts] for _ in range(settings.samples_per_prompt)]
    limit = length_within(max_length, candidate, parent)
    prompt_texts = [prompt_text_within(tok, p, max(8, limit - settings.max_new_tokens)) if max_length else
                    tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in histories]
    if not prompt_texts:
        raise ValueError("no prompts to evaluate on")
    report = progress or (lambda *a: None)
    steps = 5

    samples = {}
    for step, (name, model) in enumerate((("parent", parent), ("candidate", candidate))):
        torch.manual_seed(settings.seed)  # same sampling noise for both
        samples[name] = sample_answers(model, tok, prompt_texts, settings)
        report("evaluate", step + 1, steps)
    texts, p_ids, a_ids = samples["candidate"]
    sampled = [fit_context(p, a, limit) for p, a in zip(p_ids, a_ids)]
    kl = sum(c - p for c, p in zip(sequence_logprobs(candidate, sampled, tok.pad_token_id),
                                   sequence_logprobs(parent, sampled, tok.pad_token_id))) / len(a_ids)
    report("evaluate", 3, steps)
    margins = implicit_margins(candidate, parent, tok, list(heldout_pairs or [])[: settings.max_pairs], max_length)
    heldout = heldout_summary(margins, thresholds.min_margin, thresholds.alpha)
    report("evaluate", 4, steps)
    del candidate, parent
    gc.collect()

    answers = {name: s[0] for name, s in samples.items()}
    trained = _scores(reward_dir, dev, histories, answers)
    per_criterion = criteria_scores(reward_dir, dev, histories, answers)
    # the judge scores only the answers to its own questions (the first ``judged_prompts``)
    n = len(prompt_texts) if judged_prompts is None else judged_prompts * settings.samples_per_prompt
    judged = _scores(judge_dir, dev, histories[:n], {name: a[:n] for name, a in answers.items()}) \
        if judge_dir is not None else None
    report("evaluate", 5, steps)

    # a prompt asked again for the judge counts once in the degeneration checks and the reported
    # reward: repeats would lower both models' distinct-2, a consistent candidate's more
    once = _first_askings(prompt_texts, settings.samples_per_prompt)
    parent_summary = _summary([answers["parent"][i] for i in once], [trained["parent"][i] for i in once],
                              judged and judged["parent"])
    cand_summary = _summary([texts[i] for i in once], [trained["candidate"][i] for i in once],
                            judged and judged["candidate"])
    judge = None
    if judged is not None:
        info = judge_info or {}
        judge = {**info, **judge_trust(info.get("accuracy"), info.get("accuracy_pairs"), thresholds.alpha),
                 "parent_mean": round(parent_summary["judge_reward"], 4),
                 "candidate_mean": round(cand_summary["judge_reward"], 4),
                 **paired_gain(judged["parent"], judged["candidate"], settings.samples_per_prompt,
                               thresholds.min_reward_gain)}
    gain = cand_summary["mean_reward"] - parent_summary["mean_reward"]
    evidence = evidence_reasons(heldout, judge, thresholds)
    safety = safety_reasons(kl, parent_summary, cand_summary, thresholds,
                            per_criterion and per_criterion.get("flag_risk"))
    if thresholds.evidence == "reported":  # the evidence is shown, only safety decides
        reasons = safety
        verdict = REJECTED if safety else PASSED
    else:
        reasons = evidence + safety
        verdict = NOT_ENOUGH_EVIDENCE if heldout["pairs"] < thresholds.min_heldout_pairs else \
            (REJECTED if reasons else PASSED)
    rnd = lambda d: {k: round(v, 4) for k, v in d.items()}  # noqa: E731
    return {"passed": verdict == PASSED, "verdict": verdict, "reasons": reasons,
            "judged_by": judged_by(heldout, judge, thresholds),
            # which evidence carried the verdict, with the effect and its bound, in words (the run page)
            "decided_by": decided_by(heldout, judge, thresholds),
            "heldout": {**heldout, "alpha": thresholds.alpha, "min_pairs": thresholds.min_heldout_pairs},
            "judge": judge, "evidence_p": evidence_p(heldout, judge),
            # the run's own reward model: PPO/RLOO optimized against it, so its gain is reported, never decides
            "reward_gain": round(gain, 4),
            # the run's criterion heads (rlhf.reward.criteria_heads): mean score per criterion, predicted flag rate
            "criteria": per_criterion and per_criterion["criteria"],
            "flag_risk": per_criterion and per_criterion.get("flag_risk"),
            "kl_from_parent": round(kl, 4), "max_length": max_length or None,
            "prompts": len(prompt_texts) // settings.samples_per_prompt,
            "samples": len(prompt_texts), "parent": rnd(parent_summary), "candidate": rnd(cand_summary),
            "thresholds": asdict(thresholds),
            "examples": [{"prompt": prompts[i // settings.samples_per_prompt][-1]["content"],
                          "parent": answers["parent"][i], "candidate": texts[i]}
                         for i in once[::settings.samples_per_prompt][:6]]}
