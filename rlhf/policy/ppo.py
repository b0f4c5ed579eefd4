"""PPO (the default policy update): TRL's PPOTrainer against the cycle's reward model, with a
value model, a KL penalty to the parent and, when the reward model has a safety head, a cost
constraint (rlhf.reward.criteria_heads.CostConstraint). Prompts are not weighted: the prompts of
quarantined raters are already gone from the bundle."""
from __future__ import annotations

import copy
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlhf.models.chat_format import end_of_turn_id, end_of_turn_token
from rlhf.models.loading import answer_length, length_within, resolve_device
from rlhf.policy.common import callbacks, common_args, history, load_policy, lora_config, save_policy
from rlhf.progress import ProgressFn
from rlhf.reward.criteria_heads import CostConstraint, cost_weight, safety_calibration
from rlhf.settings import CriteriaSettings, PolicySettings
from rlhf.training import distributed
from rlhf.training.trl_utils import quiet_trl


def _ending_turns(tokenizer: Any) -> Any:
    """The tokenizer PPO trains with: TRL's PPO counts an answer as finished (no missing-EOS penalty)
    only if it contains ``eos_token_id``, so where the template's end-of-turn token is not EOS
    (Llama-3's ``<|eot_id|>``) a copy names it EOS; the saved tokenizer is the original."""
    token = end_of_turn_token(tokenizer)
    if token is None or token == tokenizer.eos_token:
        return tokenizer
    copied = copy.deepcopy(tokenizer)
    copied.eos_token = token
    return copied


def _lora_value_model(value: Any, settings: PolicySettings) -> Any:
    """The critic as a LoRA adapter (same targets and rank as the policy's) with its score head
    trained in full. Trained in all its weights, the critic was most of a LoRA cycle's cost: a
    weight gradient for every layer and Adam's two moments, about 12 bytes per parameter on top of
    the weights (benchmarks/scaling.py)."""
    from peft import LoraConfig, get_peft_model

    policy_like = lora_config(value, settings)
    config = LoraConfig(r=policy_like.r, lora_alpha=policy_like.lora_alpha, lora_dropout=0.0,
                        target_modules=policy_like.target_modules, fan_in_fan_out=policy_like.fan_in_fan_out,
                        task_type="SEQ_CLS", modules_to_save=["score"])
    return get_peft_model(value, config)


def _log_constraint(trainer: Any, constraint: CostConstraint) -> None:
    """Update the cost multiplier once per PPO batch, where TRL's PPO logs the batch's metrics (its
    training loop has no other per-batch hook), and log the constraint's numbers with them."""
    log = trainer.log

    def log_with_constraint(logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "objective/scores" in logs:
            logs.update(constraint.step())
        log(logs, *args, **kwargs)

    trainer.log = log_with_constraint


def train_ppo(policy_dir: str | Path, reward_dir: str | Path, prompts: list[list[dict]], out_dir: str | Path,
              settings: PolicySettings = PolicySettings(), device: str = "auto",
              progress: ProgressFn | None = None, logs: Any = None,
              criteria: CriteriaSettings | None = None) -> dict[str, Any]:
    """PPO with the parent as frozen reference (KL penalty), the value model initialised from the
    reward model, the chat template's end-of-turn token (EOS without one) as the stop token and a
    penalty for answers that never stop. With ``criteria.constraint`` and a reward model that has a
    safety head, the expected cost is a constraint (rlhf.reward.criteria_heads.CostConstraint): its
    multiplier's trajectory is logged per batch (``safety/*``) and returned under ``constraint``."""
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    quiet_trl()
    settings.validate()
    dev = resolve_device(device)
    torch.manual_seed(settings.seed)
    policy, tokenizer = load_policy(policy_dir)
    ref = None if settings.lora else AutoModelForCausalLM.from_pretrained(str(policy_dir))
    reward = AutoModelForSequenceClassification.from_pretrained(str(reward_dir), num_labels=1)
    value = AutoModelForSequenceClassification.from_pretrained(str(reward_dir), num_labels=1)
    for m in (reward, value):
        m.config.pad_token_id = tokenizer.pad_token_id
    if settings.lora and settings.lora_value:
        value = _lora_value_model(value, settings)
    cost = cost_weight(reward_dir) if criteria is not None and criteria.enabled and criteria.constraint else None
    constraint = None if cost is None else CostConstraint(reward, cost, criteria.lambda_init, criteria.lambda_lr,
                                                          criteria.cost_tolerance, safety_calibration(reward_dir))

    settings = replace(settings, response_length=answer_length(policy, settings.response_length))
    max_prompt = max(8, length_within(settings.max_length, policy) - settings.response_length)
    rows = []
    for p in prompts:
        ids = tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        rows.append({"input_ids": list(ids)[-max_prompt:]})
    dataset = Dataset.from_list(rows)
    # TRL's PPO repeats a drop_last loader until it has its episodes: with fewer prompts than one
    # batch (per process) it yields no batch and the loop never ends
    if len(rows) < settings.batch_size * distributed.world_size():
        raise ValueError(f"PPO needs at least one batch of prompts per process: {len(rows)} prompts, batch size "
                         f"{settings.batch_size} x {distributed.world_size()} process(es)")

    if constraint is not None:  # the limit: the parent's expected cost, before any update
        torch.manual_seed(settings.seed)
        reward.to(dev)
        constraint.measure_parent(policy.to(dev), [r["input_ids"] for r in rows], tokenizer.pad_token_id,
                                  end_of_turn_id(tokenizer), settings.response_length, settings.temperature,
                                  samples=max(64, settings.batch_size), batch_size=settings.batch_size)
    episodes = settings.episodes
    if settings.max_steps:
        episodes = min(episodes, settings.max_steps * settings.batch_size)
    with tempfile.TemporaryDirectory(prefix="ppo-") as scratch:
        args = PPOConfig(
            **common_args(dev, settings, scratch, logs), per_device_train_batch_size=settings.batch_size,
            gradient_accumulation_steps=1, num_mini_batches=settings.mini_batches, total_episodes=episodes,
            num_ppo_epochs=settings.ppo_epochs, response_length=settings.response_length,
            stop_token_id=end_of_turn_id(tokenizer),
            missing_eos_penalty=settings.missing_eos_penalty, kl_coef=settings.kl_coef,
            temperature=settings.temperature, num_sample_generations=0,
            local_rollout_forward_batch_size=settings.batch_size)
        trainer = PPOTrainer(args=args, processing_class=_ending_turns(tokenizer), model=policy, ref_model=ref,
                             reward_model=reward,
                             train_dataset=dataset, value_model=value,
                             peft_config=lora_config(policy, settings) if settings.lora else None)
        if constraint is not None:
            _log_constraint(trainer, constraint)
        callbacks(trainer, progress, "policy", logs, "ppo")
        trainer.train()
        trained = trainer.model.policy if hasattr(trainer.model, "policy") else trainer.policy_model
        save_policy(trained, tokenizer, out_dir, policy_dir, settings)
        log = trainer.state.log_history
        ranks = distributed.rank_metrics(trained, trainer.state.global_step)
    return {"algorithm": "ppo", "episodes": episodes, "updates": trainer.state.global_step,
            "prompts": len(rows), "lora": settings.lora, "lora_value": settings.lora and settings.lora_value, **ranks,
            "constraint": constraint.summary() if constraint is not None else None,
            **history(log, ("objective/scores", "objective/rlhf_reward", "objective/kl", "objective/entropy",
                             "loss/policy_avg", "loss/value_avg", "val/num_eos_tokens"))}
