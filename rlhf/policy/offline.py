"""Offline preference updates: DPO on preference pairs, KTO on single rated answers, and iterative
DPO (pairs ranked by the reward model among the policy's own sampled answers).

Row weights (rlhf.trust): DPO and KTO use *weighted resampling* with the training seed (each row
appears floor or ceil of its weight, scaled to mean 1, times: ``resample_by_weight``), not a loss
override: their loss functions are long and change between TRL releases, and a subclass copying
them would silently drift. Equal weights leave the rows, and so the training, unchanged.
"""
from __future__ import annotations

import copy
import random
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification

from rlhf.data.datasets import to_standard
from rlhf.models.loading import answer_length, context_length, length_within, resolve_device
from rlhf.policy.common import (
    callbacks,
    common_args,
    history,
    load_policy,
    lora_config,
    prompt_text_within,
    save_policy,
)
from rlhf.progress import ProgressFn
from rlhf.reward.scoring import reward_texts, score_texts
from rlhf.settings import PolicySettings
from rlhf.training import distributed
from rlhf.training.trl_utils import quiet_trl
from rlhf.trust import resample_by_weight


def _offline(trainer_cls: Any, config_cls: Any, policy_dir: str | Path, rows: list[dict], columns: tuple[str, ...],
             out_dir: str | Path, settings: PolicySettings, device: str, progress: ProgressFn | None,
             logs: Any = None, **config: Any) -> tuple[Any, Any, list[dict], dict[str, Any]]:
    """Shared run of TRL's offline preference trainers (DPO, KTO) on conversational rows:
    the parent (a frozen copy, or the adapter-free base with LoRA) is the reference."""
    quiet_trl()
    settings.validate()
    dev = resolve_device(device)
    torch.manual_seed(settings.seed)
    policy, tokenizer = load_policy(policy_dir)
    std = [to_standard(r, tokenizer) for r in rows]
    dataset = Dataset.from_list([{k: r[k] for k in columns} for r in std])
    with tempfile.TemporaryDirectory(prefix=f"{trainer_cls.__name__.lower()}-") as scratch:
        micro = min(settings.micro_batch_size or settings.batch_size, settings.batch_size)
        epochs = settings.passes(len(dataset))
        keep_end = config.get("truncation_mode") == "keep_end"  # keep_start would cut the answer
        args = config_cls(**common_args(dev, settings, scratch, logs), per_device_train_batch_size=micro,
                          gradient_accumulation_steps=max(1, round(settings.batch_size / micro)),
                          num_train_epochs=epochs, max_steps=settings.max_steps or -1, beta=settings.beta,
                          max_length=length_within(settings.max_length, policy) if keep_end
                          else context_length(policy), **config)
        trainer = trainer_cls(model=policy, ref_model=None if settings.lora else copy.deepcopy(policy), args=args,
                              train_dataset=dataset, processing_class=tokenizer,
                              peft_config=lora_config(policy, settings) if settings.lora else None)
        callbacks(trainer, progress, "policy", logs, trainer_cls.__name__.removesuffix("Trainer").lower())
        result = trainer.train()
        save_policy(trainer.model, tokenizer, out_dir, policy_dir, settings)
        # the forward passes per step, beside the ranks' metrics (policy.micro_batch_size)
        ranks = {**distributed.rank_metrics(trainer.model, result.global_step),
                 "micro_batches": args.gradient_accumulation_steps}
    return result, trainer.state.log_history, std, ranks


def train_dpo(policy_dir: str | Path, train_pairs: list[dict], out_dir: str | Path,
              settings: PolicySettings = PolicySettings(), device: str = "auto",
              progress: ProgressFn | None = None, logs: Any = None) -> dict[str, Any]:
    """Direct preference optimisation on the same preference pairs the reward model sees (row
    weights by weighted resampling)."""
    from trl import DPOConfig, DPOTrainer

    train_pairs = resample_by_weight(train_pairs, settings.seed)
    # keep_end: an over-long pair loses the start of its prompt; TRL's default (keep_start) drops
    # pairs whose prompt fills the context, which left small data sets with nothing to train on
    result, log, rows, ranks = _offline(DPOTrainer, DPOConfig, policy_dir, train_pairs,
                                        ("prompt", "chosen", "rejected"), out_dir, settings, device, progress, logs,
                                        truncation_mode="keep_end",
                                        # the reference's log-probs once, not once per epoch (the same numbers)
                                        precompute_ref_log_probs=True)
    return {"algorithm": "dpo", "pairs": len(rows), "steps": result.global_step,
            "train_loss": round(result.training_loss, 4), "lora": settings.lora, **ranks,
            **history(log, ("rewards/accuracies", "rewards/margins", "loss"))}


def train_kto(policy_dir: str | Path, train_examples: list[dict], out_dir: str | Path,
              settings: PolicySettings = PolicySettings(), device: str = "auto",
              progress: ProgressFn | None = None, logs: Any = None) -> dict[str, Any]:
    """KTO on unpaired good/bad answers (thumbs, ratings, corrections, votes); row weights by
    weighted resampling."""
    from trl import KTOConfig, KTOTrainer

    train_examples = resample_by_weight(train_examples, settings.seed)
    positives = sum(1 for r in train_examples if r["label"])
    negatives = len(train_examples) - positives
    if not positives or not negatives:
        raise ValueError("KTO needs both good and bad examples")
    # balance the classes as the KTO paper recommends
    result, log, rows, ranks = _offline(KTOTrainer, KTOConfig, policy_dir, train_examples,
                                        ("prompt", "completion", "label"), out_dir, settings, device, progress, logs,
                                        desirable_weight=1.0,
                                        undesirable_weight=max(0.5, min(2.0, positives / negatives)))
    return {"algorithm": "kto", "examples": len(rows), "positives": positives, "steps": result.global_step,
            "train_loss": round(result.training_loss, 4), "lora": settings.lora, **ranks,
            **history(log, ("rewards/chosen_sum", "rewards/rejected_sum", "kl", "loss"))}


def reward_ranked_pairs(prompts: list[list[dict]], answers: list[list[str]], scores: list[list[float]],
                        pairs_per_prompt: int, min_gap: float) -> tuple[list[dict], dict[str, Any]]:
    """Preference pairs from answers the reward model ranked: for each prompt, its best answer over its
    worst, the second best over the second worst, ... (``pairs_per_prompt``), each only where the
    scores differ by at least ``min_gap`` reward standard deviations (over all the scores) and the
    texts differ; an empty answer is never chosen. Returns the pairs (conversational rows, as
    rlhf.data.datasets writes them) and what was kept."""
    flat = [x for row in scores for x in row]
    mean = sum(flat) / max(1, len(flat))
    std = (sum((x - mean) ** 2 for x in flat) / max(1, len(flat) - 1)) ** 0.5 or 1.0
    rows, gaps = [], []
    for prompt, texts, row in zip(prompts, answers, scores):
        order = sorted(range(len(texts)), key=lambda i: row[i], reverse=True)
        for k in range(min(pairs_per_prompt, len(order) // 2)):
            best, worst = order[k], order[-1 - k]
            gap = (row[best] - row[worst]) / std
            if gap < min_gap or not texts[best].strip() or texts[best] == texts[worst]:
                continue
            rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": texts[best]}],
                         "rejected": [{"role": "assistant", "content": texts[worst]}], "source": "reward_ranked"})
            gaps.append(gap)
    return rows, {"pairs": len(rows), "prompts": len(prompts), "answers": len(flat),
                  "reward_std": round(std, 4), "mean_gap_std": round(sum(gaps) / len(gaps), 3) if gaps else None}


def train_iterative_dpo(policy_dir: str | Path, reward_dir: str | Path, prompts: list[list[dict]],
                        out_dir: str | Path, settings: PolicySettings = PolicySettings(), device: str = "auto",
                        progress: ProgressFn | None = None, logs: Any = None) -> dict[str, Any]:
    """One round of iterative (online) DPO: the parent samples ``settings.samples_per_prompt``
    answers to every distinct training prompt, the reward model ranks them, and DPO trains on the
    best-versus-worst pairs (rejection sampling for pairs, as in RSO and in the iterative DPO of
    Xiong et al. 2024). The pairs are on-policy (the parent's own answers, so DPO's reference
    likelihoods are meaningful) and as many as the prompts allow, however little feedback trained
    the reward model; the next cycle, whose parent is the promoted policy, is the next round."""
    from rlhf.models.sampling import GENERATE_ROWS, sample_answers  # the gate's: stops at a turn's end as serving does
    from rlhf.settings import EvalSettings

    settings.validate()
    dev = resolve_device(device)
    policy, tokenizer = load_policy(policy_dir)
    policy.to(dev).eval()
    distinct = list({repr(p): p for p in prompts}.values())
    if settings.max_prompts and len(distinct) > settings.max_prompts:  # the sampling and DPO's steps grow with them
        distinct = random.Random(settings.seed).sample(distinct, settings.max_prompts)
    settings = replace(settings, response_length=answer_length(policy, settings.response_length))
    max_prompt = max(8, length_within(settings.max_length, policy) - settings.response_length)
    texts = [prompt_text_within(tokenizer, p, max_prompt) for p in distinct]
    n = settings.samples_per_prompt
    sampling = EvalSettings(max_new_tokens=settings.response_length, temperature=settings.temperature,
                            top_p=settings.top_p)
    report = progress or (lambda *a: None)
    answers: list[str] = []
    chunk = max(1, GENERATE_ROWS // n)  # prompts per generate call
    torch.manual_seed(settings.seed)
    for i in range(0, len(texts), chunk):
        batch = [t for t in texts[i:i + chunk] for _ in range(n)]
        answers += sample_answers(policy, tokenizer, batch, sampling)[0]
        report("policy", 0, 1)  # sampling: the DPO steps report progress after it
    del policy
    reward = AutoModelForSequenceClassification.from_pretrained(str(reward_dir), num_labels=1)
    reward.config.pad_token_id = tokenizer.pad_token_id
    reward.to(dev).eval()
    histories = [distinct[j // n] for j in range(len(answers))]
    with torch.no_grad():  # each answer after its conversation, as the reward model was trained (and the gate scores)
        flat = score_texts(reward, tokenizer, reward_texts(tokenizer, histories, answers))
    del reward
    grouped = [answers[j * n:(j + 1) * n] for j in range(len(texts))]
    scored = [flat[j * n:(j + 1) * n] for j in range(len(texts))]
    pairs, kept = reward_ranked_pairs(distinct, grouped, scored, settings.pairs_per_prompt, settings.min_pair_gap)
    if not pairs:
        raise ValueError(f"iterative DPO: the reward model ranked {len(answers)} sampled answers to "
                         f"{len(texts)} prompts and no two differed by {settings.min_pair_gap} standard deviations")
    dpo = replace(settings, batch_size=min(settings.batch_size, len(pairs)))
    metrics = train_dpo(policy_dir, pairs, out_dir, dpo, device, progress, logs)
    kept["longest_prompt_tokens"] = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return {**metrics, "algorithm": "iterative_dpo", "sampled": kept}
