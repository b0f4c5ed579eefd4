"""RLOO: TRL's RLOOTrainer with the reward model as a reward function. Several answers per prompt,
each one's advantage taken against the mean of the others (no value model). Prompts are not
weighted: the prompts of quarantined raters are already gone from the bundle."""
from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification

from rlhf.models.loading import answer_length, length_within, resolve_device
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


def _reward_function(reward: Any, tokenizer: Any) -> Callable[..., list[float]]:
    """The reward model as a TRL reward function. TRL passes each prompt's text, its completion and
    the row's other columns: ``conversation`` (JSON) is the conversation the prompt renders, and the
    completion (stripped, as serving stores an answer) is scored after it as the reward model was
    trained (``reward_texts``), not glued to the prompt text. TRL's own path for a reward *model*
    tokenizes prompt + completion without truncation, which overruns the model's positions when a
    re-encoded completion comes out longer than it was generated; ``score_texts`` keeps the end of
    over-long texts (where the reward is read)."""

    def reward_model_score(prompts: list[str], completions: list[str], conversation: list[str],
                           **_: Any) -> list[float]:
        histories = [json.loads(c) for c in conversation]
        return score_texts(reward, tokenizer, reward_texts(tokenizer, histories, [c.strip() for c in completions]))

    return reward_model_score


def train_rloo(policy_dir: str | Path, reward_dir: str | Path, prompts: list[list[dict]], out_dir: str | Path,
               settings: PolicySettings = PolicySettings(), device: str = "auto",
               progress: ProgressFn | None = None, logs: Any = None) -> dict[str, Any]:
    """REINFORCE leave-one-out with the trained reward model as the reward function."""
    from trl import RLOOConfig, RLOOTrainer

    quiet_trl()
    settings.validate()
    dev = resolve_device(device)
    torch.manual_seed(settings.seed)
    policy, tokenizer = load_policy(policy_dir)
    reward = AutoModelForSequenceClassification.from_pretrained(str(reward_dir), num_labels=1)
    reward.config.pad_token_id = tokenizer.pad_token_id
    settings = replace(settings, response_length=answer_length(policy, settings.response_length))
    max_prompt = max(8, length_within(settings.max_length, policy) - settings.response_length)
    texts = [prompt_text_within(tokenizer, p, max_prompt) for p in prompts]
    # the conversation beside its rendered prompt: TRL hands the row's columns to the reward function
    dataset = Dataset.from_list([{"prompt": t, "conversation": json.dumps(p)} for t, p in zip(texts, prompts)])
    steps = settings.max_steps or max(1, settings.episodes // settings.batch_size)
    with tempfile.TemporaryDirectory(prefix="rloo-") as scratch:
        args = RLOOConfig(**common_args(dev, settings, scratch, logs), per_device_train_batch_size=settings.batch_size,
                          num_generations=settings.rloo_generations, max_completion_length=settings.response_length,
                          max_steps=steps, temperature=settings.temperature,
                          beta=settings.kl_coef)
        trainer = RLOOTrainer(model=policy, reward_funcs=_reward_function(reward.to(dev).eval(), tokenizer), args=args,
                              train_dataset=dataset, processing_class=tokenizer,
                              peft_config=lora_config(policy, settings) if settings.lora else None)
        callbacks(trainer, progress, "policy", logs, "rloo")
        result = trainer.train()
        save_policy(trainer.model, tokenizer, out_dir, policy_dir, settings)
        log = trainer.state.log_history
        ranks = distributed.rank_metrics(trainer.model, result.global_step)
    return {"algorithm": "rloo", "prompts": len(texts), "steps": result.global_step, "lora": settings.lora, **ranks,
            **history(log, ("reward", "kl", "loss"))}
