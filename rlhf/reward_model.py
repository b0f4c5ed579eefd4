"""Reward model: TRL's RewardTrainer on preference pairs, from the policy's own backbone.

The model is ``AutoModelForSequenceClassification(num_labels=1)`` loaded from the policy
directory, so it shares the policy's tokenizer and has the ``score`` head TRL's PPO reads.

Rows may carry a ``weight`` (rlhf.rater_trust): each pair's loss is multiplied by it (weights
scaled to mean 1 over the training pairs, so the learning rate keeps its meaning), by a
``RewardTrainer`` subclass that overrides ``compute_loss``; the weight travels the way TRL's
``margin`` does (a dataset column kept by the signature columns, a tensor from the collator).
Equal weights train exactly as without them.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from . import distributed
from .loading import resolve_device
from .preference_data import to_standard
from .rater_trust import normalized_weights
from .trl_utils import ProgressCallback, attach_logs, drop_printer, quiet_trl, report_to, training_precision
from .progress import ProgressFn
from .settings import RewardSettings


def load_reward_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[Any, Any]:
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    return model.to(device).eval(), tok


def context_length(model: Any, default: int = 1024) -> int:
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(model.config, attr, None)
        if isinstance(value, int):
            return value
    return default


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
                return out

        class WeightedRewardTrainer(RewardTrainer):
            """RewardTrainer whose per-pair loss is multiplied by the batch's ``weight``."""

            def _set_signature_columns_if_needed(self):
                super()._set_signature_columns_if_needed()
                if "weight" not in self._signature_columns:  # else remove_unused_columns drops it
                    self._signature_columns = [*self._signature_columns, "weight"]

            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                weight = inputs.pop("weight", None)
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

        _WEIGHTED.update(trainer=WeightedRewardTrainer, collator=WeightedPreferenceCollator)
    return _WEIGHTED["trainer"], _WEIGHTED["collator"]


def train_reward_model(policy_dir: str | Path, train_pairs: list[dict], eval_pairs: list[dict], out_dir: str | Path,
                       settings: RewardSettings = RewardSettings(), device: str = "auto",
                       progress: ProgressFn | None = None, logs: Any = None, stage: str = "reward"
                       ) -> dict[str, Any]:
    """Train on conversational pairs (``preference_data`` rows, each pair's loss weighted by its
    ``weight`` when the rows have unequal ones); save to ``out_dir``; return metrics
    including pairwise accuracy on ``eval_pairs``. ``logs`` (rlhf.curves.TrainingLogs): where the
    per-step logs go (training curves, TensorBoard); ``stage``: the name progress is reported under."""
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

    train_rows = [to_standard(r, tokenizer) for r in train_pairs]
    eval_rows = [to_standard(r, tokenizer) for r in eval_pairs]
    max_length = min(settings.max_length, context_length(model))
    weights = normalized_weights(train_pairs)
    train_ds = Dataset.from_list(tokenized_pairs(tokenizer, train_rows, max_length, weights))

    steps_per_epoch = math.ceil(len(train_rows) / settings.batch_size)
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
            **training_precision(dev))
        trainer = trainer_class(model=model, args=args, train_dataset=train_ds, processing_class=tokenizer,
                                data_collator=None if weights is None else collator_class(
                                    pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                    else tokenizer.eos_token_id, pad_to_multiple_of=args.pad_to_multiple_of),
                                callbacks=[ProgressCallback(progress, stage)] if progress else None)
        drop_printer(trainer)
        attach_logs(trainer, logs, stage, "reward")
        result = trainer.train()
    model = trainer.model.eval()
    # Training accuracy as TRL logged it over the last epoch's steps: scoring every training pair
    # again would cost about as much as several training steps.
    last_epoch = result.global_step - steps_per_epoch
    logged = [row["accuracy"] for row in trainer.state.log_history
              if "accuracy" in row and row.get("step", 0) > last_epoch]
    metrics = {
        "train_pairs": len(train_rows), "eval_pairs": len(eval_rows), "steps": result.global_step,
        "train_loss": round(result.training_loss, 4), "weighted": weights is not None,
        "train_accuracy": round(sum(logged) / len(logged), 4) if logged else pairwise_accuracy(model, tokenizer, train_rows),
        "heldout_accuracy": pairwise_accuracy(model, tokenizer, eval_rows),
        **distributed.rank_metrics(model, result.global_step),
    }
    if distributed.is_main():  # every process holds the same weights; the others read these files next
        model.save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))
    distributed.barrier()
    return metrics
