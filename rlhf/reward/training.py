"""Reward model: TRL's RewardTrainer on preference pairs, from the policy's own backbone.

The model is ``AutoModelForSequenceClassification(num_labels=1)`` loaded from the policy
directory, so it shares the policy's tokenizer and has the ``score`` head TRL's PPO reads.

Rows may carry a ``weight`` (rlhf.trust): each pair's loss is multiplied by it (weights
scaled to mean 1 over the training pairs, so the learning rate keeps its meaning), by a
``RewardTrainer`` subclass that overrides ``compute_loss``; the weight travels the way TRL's
``margin`` does (a dataset column kept by the signature columns, a tensor from the collator).
Equal weights train exactly as without them.
"""
from __future__ import annotations

import json
import math
import tempfile
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlhf.data.criteria import CRITERIA, SAFETY
from rlhf.data.datasets import to_standard
from rlhf.models.frozen_features import FrozenFeatureCache
from rlhf.models.layers import train_top_layers
from rlhf.models.loading import context_length, resolve_device
from rlhf.progress import ProgressFn
from rlhf.reward.criteria_heads import (
    HEADS_FILE,
    HELPFULNESS,
    INFO_FILE,
    CriteriaScorer,
    fit_calibration,
    set_scalar_head,
)
from rlhf.reward.scoring import TRAINED_LENGTH_KEY, pairwise_accuracy, reward_texts
from rlhf.settings import CriteriaSettings, RewardSettings
from rlhf.training import distributed
from rlhf.training.trl_utils import (
    ProgressCallback,
    attach_logs,
    drop_printer,
    quiet_trl,
    report_to,
    training_precision,
)
from rlhf.trust import normalized_weights


def tokenized_pairs(tokenizer: Any, rows: list[dict], max_length: int,
                    weights: list[float] | None = None) -> list[dict]:
    """Standard-format pairs as the token ids RewardTrainer trains on, each text cut to its last
    ``max_length`` tokens. Left to itself, TRL drops every pair longer than ``max_length``: a
    small data set of long conversations then had no pair left (a sampler error), and long
    answers were never learned from. The end is kept because the reward is read at the last
    token, as ``score_texts`` reads it."""
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"][-max_length:]

    out = [{"chosen_ids": ids(r["prompt"] + r["chosen"]), "rejected_ids": ids(r["prompt"] + r["rejected"]),
            "margin": r["margin"]} for r in rows]
    if weights is not None:
        for row, w in zip(out, weights):
            row["weight"] = w
    return out


_WEIGHTED: dict[str, type] = {}


def weighted_reward_trainer() -> tuple[type, type]:
    """(trainer class, collator class): TRL's RewardTrainer and preference collator that also take a
    per-pair ``weight`` column. Without one they are TRL's own, unchanged."""
    if not _WEIGHTED:
        from trl import RewardTrainer
        from trl.trainer.reward_trainer import DataCollatorForPreference

        class WeightedPreferenceCollator(DataCollatorForPreference):
            """TRL's collator plus ``weight`` (a float tensor, like ``margin``)."""

            def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
                out = super().torch_call(examples)
                if "weight" in examples[0]:
                    out["weight"] = torch.tensor([e["weight"] for e in examples], dtype=torch.float)
                if "head" in examples[0]:  # rlhf.reward.criteria_heads: which score head the pair trains
                    out["head"] = torch.tensor([e["head"] for e in examples], dtype=torch.long)
                return out

        class WeightedRewardTrainer(RewardTrainer):
            """RewardTrainer whose per-pair loss is multiplied by the batch's ``weight``."""

            def _set_signature_columns_if_needed(self):
                super()._set_signature_columns_if_needed()
                for column in ("weight", "head"):  # else remove_unused_columns drops them
                    if column not in self._signature_columns:
                        self._signature_columns = [*self._signature_columns, column]

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                weight = inputs.pop("weight", None)
                head = inputs.pop("head", None)
                if head is not None:
                    return self.multi_head_loss(model, inputs, head, weight, return_outputs)
                loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                     num_items_in_batch=num_items_in_batch)
                if weight is not None:
                    loss = self.weighted_loss(outputs.logits, inputs.get("margin"), weight)
                return (loss, outputs) if return_outputs else loss

            def weighted_loss(self, logits: torch.Tensor, margin: torch.Tensor | None,
                              weight: torch.Tensor) -> torch.Tensor:
                """TRL's loss with each pair's terms multiplied by its weight (weights of 1: the same
                numbers): ``-logsigmoid(r_c - r_r - margin)`` and the centering term."""
                chosen, rejected = torch.chunk(logits.squeeze(-1), chunks=2)
                weight = weight.to(chosen.dtype)
                diff = chosen - rejected if margin is None else chosen - rejected - margin
                loss = (weight * -torch.nn.functional.logsigmoid(diff)).mean()
                if self.args.center_rewards_coefficient is not None:
                    loss = loss + self.args.center_rewards_coefficient * (weight * (chosen + rejected) ** 2).mean()
                return loss

            def multi_head_loss(self, model: Any, inputs: dict[str, Any], head: torch.Tensor,
                                weight: torch.Tensor | None, return_outputs: bool) -> Any:
                """Each pair trains its own score head's column (rlhf.reward.criteria_heads): TRL's
                Bradley-Terry loss and centering term on ``logits[:, head]``, weighted like the rest."""
                margin = inputs.pop("margin", None)
                outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
                both = outputs.logits.gather(1, torch.cat([head, head])[:, None]).squeeze(1)
                chosen, rejected = torch.chunk(both, chunks=2)
                w = torch.ones_like(chosen) if weight is None else weight.to(chosen.dtype)
                diff = chosen - rejected if margin is None else chosen - rejected - margin
                loss = (w * -torch.nn.functional.logsigmoid(diff)).mean()
                if self.args.center_rewards_coefficient is not None:
                    loss = loss + self.args.center_rewards_coefficient * (w * (chosen + rejected) ** 2).mean()
                mode = "train" if self.model.training else "eval"
                with torch.no_grad():
                    self._metrics[mode]["accuracy"].append((chosen > rejected).float().mean().item())
                    self._metrics[mode]["margin"].append((chosen - rejected).mean().item())
                return (loss, outputs) if return_outputs else loss

        _WEIGHTED.update(trainer=WeightedRewardTrainer, collator=WeightedPreferenceCollator)
    return _WEIGHTED["trainer"], _WEIGHTED["collator"]


def criterion_heads(criteria_rows: dict[str, list[dict]] | None,
                    settings: CriteriaSettings) -> tuple[list[str], dict[str, str]]:
    """The heads a reward model trains: helpfulness first, then each criterion with at least
    ``settings.min_pairs`` training pairs (``[]`` when none has: one head, trained as before), and
    why each other criterion was left out."""
    counts = Counter(r["criterion"] for r in (criteria_rows or {}).get("train", []))
    left_out = {c: f"{counts[c]} training pairs, fewer than {settings.min_pairs}" for c in CRITERIA
                if counts[c] < settings.min_pairs}
    if not settings.enabled:
        return [], {c: "criteria off (training.criteria.enabled)" for c in CRITERIA}
    chosen = [c for c in CRITERIA if c not in left_out]
    return ([HELPFULNESS, *chosen] if chosen else []), left_out


def tokenized_criterion_pairs(tokenizer: Any, rows: list[dict], heads: list[str] | None, max_length: int) -> list[dict]:
    """Pairs whose sides have their own prompts (criterion pairs, rated pairs) as RewardTrainer's
    token ids; with ``heads``, each with the index of its head (a row without ``criterion``: 0,
    helpfulness)."""
    def ids(prompt: list[dict], answer: str) -> list[int]:
        text = reward_texts(tokenizer, [prompt], [answer])[0]
        return tokenizer(text, add_special_tokens=False)["input_ids"][-max_length:]

    out = [{"chosen_ids": ids(r["chosen_prompt"], r["chosen"]),
            "rejected_ids": ids(r["rejected_prompt"], r["rejected"]),
            "margin": float(r.get("margin", 0.0))} for r in rows]
    if heads:
        for row, r in zip(out, rows):
            row["head"] = heads.index(r.get("criterion", HELPFULNESS))
    return out


def _criteria_outcome(model: Any, tokenizer: Any, heads: list[str], left_out: dict[str, str],
                      crit_train: list[dict], crit_eval: list[dict], settings: CriteriaSettings) -> dict[str, Any]:
    """After multi-head training: each head's held-out accuracy, the safety head's calibration, and
    ``model`` given the scalar head PPO optimizes (helpfulness + weighted chip criteria)."""
    weight = model.score.weight.detach().clone()
    scorer = CriteriaScorer(model, tokenizer, heads, {})
    out: dict[str, Any] = {"heads": heads, "left_out": left_out, "heldout_accuracy": {}, "pairs": {}}
    for k, name in enumerate(heads[1:], start=1):
        rows = [r for r in crit_eval if r["criterion"] == name]
        out["pairs"][name] = {"train": sum(r["criterion"] == name for r in crit_train), "eval": len(rows)}
        if rows:
            hi = scorer.score_answers([r["chosen_prompt"] for r in rows], [r["chosen"] for r in rows])[name]
            lo = scorer.score_answers([r["rejected_prompt"] for r in rows], [r["rejected"] for r in rows])[name]
            out["heldout_accuracy"][name] = round(sum(h > lo_ for h, lo_ in zip(hi, lo)) / len(rows), 4)
        else:
            out["heldout_accuracy"][name] = None
    calibration = {}
    if SAFETY in heads:
        rows = [r for r in crit_train if r["criterion"] == SAFETY]
        costly = {(json.dumps(r["chosen_prompt"]), r["chosen"]): r for r in rows}
        safe = {(json.dumps(r["rejected_prompt"]), r["rejected"]): r for r in rows}

        def costs(items: dict, side: str) -> list[float]:
            vals = list(items.values())
            return (scorer.score_answers([r[f"{side}_prompt"] for r in vals], [r[side] for r in vals])[SAFETY]
                    if vals else [])

        calibration[SAFETY] = fit_calibration(costs(costly, "chosen"), costs(safe, "rejected"))
    out["calibration"] = calibration
    out["weights"] = {HELPFULNESS: 1.0, **{c: settings.weight_of(c) for c in heads[1:] if c != SAFETY}}
    combined = sum(w * weight[heads.index(c)] for c, w in out["weights"].items())
    out["_weight"] = weight
    set_scalar_head(model, combined)
    return out


def train_reward_model(policy_dir: str | Path, train_pairs: list[dict], eval_pairs: list[dict], out_dir: str | Path,
                       settings: RewardSettings = RewardSettings(), device: str = "auto",
                       progress: ProgressFn | None = None, logs: Any = None, stage: str = "reward",
                       criteria_rows: dict[str, list[dict]] | None = None,
                       criteria: CriteriaSettings = CriteriaSettings(),
                       rated_rows: list[dict] | None = None) -> dict[str, Any]:
    """Train on conversational pairs (``preference_data`` rows, each pair's loss weighted by its
    ``weight`` when the rows have unequal ones); save to ``out_dir``; return metrics
    including pairwise accuracy on ``eval_pairs``. ``logs`` (rlhf.training.curves.TrainingLogs): where the
    per-step logs go (training curves, TensorBoard); ``stage``: the name progress is reported under.

    ``criteria_rows`` (``DatasetBundle.criteria``): with enough pairs for a criterion, the model
    trains one score head per criterion beside helpfulness on the same backbone (rlhf.reward.criteria_heads);
    the saved model keeps one output, the weighted combination, and the heads are saved beside it.
    ``rated_rows`` (``DatasetBundle.rated["train"]``): pairs across questions, each side with its own
    prompt, trained like the pairs (the helpfulness head)."""
    from trl import RewardConfig

    trainer_class, collator_class = weighted_reward_trainer()
    quiet_trl()
    dev = resolve_device(device)
    tokenizer = AutoTokenizer.from_pretrained(str(policy_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(policy_dir), num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    # The score head starts small so the untrained reward is near zero for every answer.
    torch.manual_seed(settings.seed)
    torch.nn.init.normal_(model.score.weight, std=1e-3)
    trained = train_top_layers(model, settings.trainable_layers)

    heads, left_out = criterion_heads(criteria_rows, criteria)
    crit_train = [r for r in (criteria_rows or {}).get("train", []) if r["criterion"] in heads]
    crit_eval = [r for r in (criteria_rows or {}).get("eval", []) if r["criterion"] in heads]
    train_rows = [to_standard(r, tokenizer) for r in train_pairs]
    eval_rows = [to_standard(r, tokenizer) for r in eval_pairs]
    max_length = min(settings.max_length, context_length(model))
    # saved with the model: every scorer reads a text as the model was trained on it (scoring.reading_length)
    setattr(model.config, TRAINED_LENGTH_KEY, max_length)
    rated = list(rated_rows or [])
    weights = normalized_weights(list(train_pairs) + rated + crit_train)
    data = tokenized_pairs(tokenizer, train_rows, max_length, weights and weights[:len(train_rows)])
    extra = tokenized_criterion_pairs(tokenizer, rated + crit_train, heads, max_length)
    for row, w in zip(extra, (weights or [])[len(train_rows):]):
        row["weight"] = w
    if heads:
        for row in data:
            row["head"] = 0
    data += extra
    train_ds = Dataset.from_list(data)

    steps_per_epoch = math.ceil(len(data) / settings.batch_size)
    epochs = max(settings.epochs, math.ceil(settings.min_steps / max(1, steps_per_epoch)))
    # Logged often enough for a curve (about 100 points at most), never less than once per epoch.
    total_steps = settings.max_steps if settings.max_steps > 0 else math.ceil(epochs * steps_per_epoch)
    logging_steps = max(1, min(steps_per_epoch, math.ceil(total_steps / 100)))
    with tempfile.TemporaryDirectory(prefix="reward-") as scratch:
        args = RewardConfig(
            output_dir=scratch, num_train_epochs=epochs, max_steps=settings.max_steps,
            per_device_train_batch_size=settings.batch_size, learning_rate=settings.learning_rate,
            max_length=max_length, center_rewards_coefficient=settings.center_rewards_coefficient,
            lr_scheduler_type="linear", warmup_steps=max(1, steps_per_epoch // 4), weight_decay=0.0,
            logging_steps=logging_steps, save_strategy="no", report_to=report_to(logs), disable_tqdm=True,
            seed=settings.seed, data_seed=settings.seed, use_cpu=dev.type == "cpu", dataloader_num_workers=0,
            gradient_checkpointing=False,  # as the policy's (rlhf.policy.common.common_args)
            **training_precision(dev))
        trainer = trainer_class(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                                data_collator=None if weights is None and not heads else collator_class(
                                    pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                    else tokenizer.eos_token_id, pad_to_multiple_of=args.pad_to_multiple_of),
                                callbacks=[ProgressCallback(progress, stage)] if progress else None)
        if heads:  # TRL checks for one output at construction; the heads replace it before training
            scalar = model.score.weight.detach()
            wide = torch.nn.Linear(scalar.shape[1], len(heads), bias=False)
            torch.nn.init.normal_(wide.weight, std=1e-3)
            model.score = wide.to(device=scalar.device, dtype=scalar.dtype)
            model.config.num_labels = len(heads)
        drop_printer(trainer)
        attach_logs(trainer, logs, stage, "reward")
        # Frozen lower blocks: their features are computed once per sequence, not once per step.
        cache = FrozenFeatureCache(model, trained["trained_blocks"]) \
            if trained["trained_blocks"] < trained["blocks"] else nullcontext()
        with cache:
            result = trainer.train()
    model = trainer.model.eval()
    outcome = _criteria_outcome(model, tokenizer, heads, left_out, crit_train, crit_eval, criteria) if heads else None
    # Training accuracy as TRL logged it over the last epoch's steps: scoring every training pair
    # again would cost about as much as several training steps.
    last_epoch = result.global_step - steps_per_epoch
    logged = [row["accuracy"] for row in trainer.state.log_history
              if "accuracy" in row and row.get("step", 0) > last_epoch]
    metrics = {
        "train_pairs": len(train_rows), "rated_pairs": len(rated), "eval_pairs": len(eval_rows),
        "steps": result.global_step, **trained,
        **({"feature_cache": cache.stats()} if isinstance(cache, FrozenFeatureCache) else {}),
        "train_loss": round(result.training_loss, 4), "weighted": weights is not None,
        "train_accuracy": (round(sum(logged) / len(logged), 4) if logged
                           else pairwise_accuracy(model, tokenizer, train_rows)),
        "heldout_accuracy": pairwise_accuracy(model, tokenizer, eval_rows),
        "criteria": {"heads": [], "left_out": left_out} if outcome is None else
        {k: v for k, v in outcome.items() if not k.startswith("_")},
        **distributed.rank_metrics(model, result.global_step),
    }
    if distributed.is_main():  # every process holds the same weights; the others read these files next
        model.save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))
        if outcome is not None:
            from safetensors.torch import save_file

            save_file({"weight": outcome["_weight"].float().contiguous().cpu()}, str(Path(out_dir) / HEADS_FILE))
            (Path(out_dir) / INFO_FILE).write_text(json.dumps(metrics["criteria"], indent=1))
    distributed.barrier()
    return metrics
