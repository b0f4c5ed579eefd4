"""Policy updates with TRL: PPO (default), or DPO, KTO and RLOO on the same data.

Every function takes the parent policy directory and writes the new policy to ``out_dir``: a
plain ``save_pretrained`` directory, or with ``lora`` the LoRA adapter alone (peft's
``save_pretrained``), whose ``base_model_name_or_path`` is the parent directory: served on top
of the parent's loaded weights (rlhf.adapters). ``lora_merge`` writes the merged model instead.
They never change the parent; a failure leaves ``out_dir`` to be discarded by the caller.

Row weights (rlhf.rater_trust): DPO and KTO use *weighted resampling* with the training seed
(each row appears floor or ceil of its weight, scaled to mean 1, times: rlhf.rater_trust.
resample_by_weight), not a loss override: their loss functions are long and change between TRL
releases, and a subclass copying them would silently drift. Equal weights leave the rows, and so
the training, unchanged. PPO and RLOO take prompts, which are not weighted: the prompts of
quarantined raters are already gone from the bundle.
"""
from __future__ import annotations

import copy
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from . import distributed
from .chat_format import end_of_turn_id, end_of_turn_token
from .criteria_model import CostConstraint, cost_weight, safety_calibration
from .loading import resolve_device
from .preference_data import to_standard
from .rater_trust import resample_by_weight
from .reward_model import context_length, score_texts
from .trl_utils import ProgressCallback, attach_logs, drop_printer, quiet_trl, report_to, training_precision
from .progress import ProgressFn
from .settings import CriteriaSettings, PolicySettings


def _callbacks(trainer: Any, progress: ProgressFn | None, stage: str, logs: Any = None, name: str = "") -> None:
    drop_printer(trainer)
    trainer.add_callback(ProgressCallback(progress, stage))
    attach_logs(trainer, logs, stage, name)


def _lora_config(model: Any, settings: PolicySettings):
    from peft import LoraConfig

    names = {n.split(".")[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) or
             type(m).__name__ == "Conv1D"}
    # attention and MLP projections of GPT-2 (c_*), Phi (dense, fc1/fc2), Llama and Qwen2 (*_proj)
    # and GPT-NeoX (query_key_value, dense*): never the output head
    targets = sorted(names & {"c_attn", "c_proj", "c_fc", "q_proj", "k_proj", "v_proj", "o_proj", "dense",
                              "fc1", "fc2", "gate_proj", "up_proj", "down_proj", "query_key_value",
                              "dense_h_to_4h", "dense_4h_to_h"}) or "all-linear"
    conv1d = any(type(m).__name__ == "Conv1D" for m in model.modules())  # GPT-2 stores weights transposed
    return LoraConfig(r=settings.lora_r, lora_alpha=2 * settings.lora_r, lora_dropout=0.0, target_modules=targets,
                      task_type="CAUSAL_LM", fan_in_fan_out=conv1d)


def _save_policy(model: Any, tokenizer: Any, out_dir: str | Path, policy_dir: str | Path,
                 settings: PolicySettings) -> None:
    if not distributed.is_main():  # the processes hold the same weights; one writes them
        return
    if hasattr(model, "merge_and_unload"):  # LoRA
        if settings.lora_merge:  # bake the adapter into plain weights
            model = model.merge_and_unload()
        else:  # the adapter alone, naming the parent it was trained on as its base
            for cfg in model.peft_config.values():
                cfg.base_model_name_or_path = str(Path(policy_dir).resolve())
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def _history(log_history: list[dict], keys: tuple[str, ...]) -> dict[str, Any]:
    """First and last logged value of each metric (how it moved during training)."""
    out: dict[str, Any] = {}
    for key in keys:
        values = [row[key] for row in log_history if key in row]
        if values:
            out[key] = {"first": round(float(values[0]), 4), "last": round(float(values[-1]), 4)}
    return out


def _common_args(dev: torch.device, settings: PolicySettings, scratch: str, logs: Any = None) -> dict[str, Any]:
    return dict(output_dir=scratch, learning_rate=settings.learning_rate, save_strategy="no", report_to=report_to(logs),
                disable_tqdm=True, logging_steps=1, seed=settings.seed, data_seed=settings.seed,
                use_cpu=dev.type == "cpu", dataloader_num_workers=0, **training_precision(dev))


def _load_policy(policy_dir: str | Path) -> tuple[Any, Any]:
    tokenizer = AutoTokenizer.from_pretrained(str(policy_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(policy_dir))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


# ---------------------------------------------------------------------------- PPO

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

    policy_like = _lora_config(value, settings)
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
    safety head, the expected cost is a constraint (rlhf.criteria_model.CostConstraint): its
    multiplier's trajectory is logged per batch (``safety/*``) and returned under ``constraint``."""
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    quiet_trl()
    settings.validate()
    dev = resolve_device(device)
    torch.manual_seed(settings.seed)
    policy, tokenizer = _load_policy(policy_dir)
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

    max_prompt = max(8, context_length(policy) - settings.response_length)
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
            **_common_args(dev, settings, scratch, logs), per_device_train_batch_size=settings.batch_size,
            gradient_accumulation_steps=1, num_mini_batches=settings.mini_batches, total_episodes=episodes,
            num_ppo_epochs=settings.ppo_epochs, response_length=settings.response_length,
            stop_token_id=end_of_turn_id(tokenizer),
            missing_eos_penalty=settings.missing_eos_penalty, kl_coef=settings.kl_coef,
            temperature=settings.temperature, num_sample_generations=0,
            local_rollout_forward_batch_size=settings.batch_size)
        trainer = PPOTrainer(args=args, processing_class=_ending_turns(tokenizer), model=policy, ref_model=ref,
                             reward_model=reward,
                             train_dataset=dataset, value_model=value,
                             peft_config=_lora_config(policy, settings) if settings.lora else None)
        if constraint is not None:
            _log_constraint(trainer, constraint)
        _callbacks(trainer, progress, "policy", logs, "ppo")
        trainer.train()
        trained = trainer.model.policy if hasattr(trainer.model, "policy") else trainer.policy_model
        _save_policy(trained, tokenizer, out_dir, policy_dir, settings)
        log = trainer.state.log_history
        ranks = distributed.rank_metrics(trained, trainer.state.global_step)
    return {"algorithm": "ppo", "episodes": episodes, "updates": trainer.state.global_step,
            "prompts": len(rows), "lora": settings.lora, "lora_value": settings.lora and settings.lora_value, **ranks,
            "constraint": constraint.summary() if constraint is not None else None,
            **_history(log, ("objective/scores", "objective/rlhf_reward", "objective/kl", "objective/entropy",
                             "loss/policy_avg", "loss/value_avg", "val/num_eos_tokens"))}


# ---------------------------------------------------------------------------- DPO / KTO

def _offline(trainer_cls: Any, config_cls: Any, policy_dir: str | Path, rows: list[dict], columns: tuple[str, ...],
             out_dir: str | Path, settings: PolicySettings, device: str, progress: ProgressFn | None,
             logs: Any = None, **config: Any) -> tuple[Any, Any, list[dict], dict[str, Any]]:
    """Shared run of TRL's offline preference trainers (DPO, KTO) on conversational rows:
    the parent (a frozen copy, or the adapter-free base with LoRA) is the reference."""
    quiet_trl()
    settings.validate()
    dev = resolve_device(device)
    torch.manual_seed(settings.seed)
    policy, tokenizer = _load_policy(policy_dir)
    std = [to_standard(r, tokenizer) for r in rows]
    dataset = Dataset.from_list([{k: r[k] for k in columns} for r in std])
    with tempfile.TemporaryDirectory(prefix=f"{trainer_cls.__name__.lower()}-") as scratch:
        args = config_cls(**_common_args(dev, settings, scratch, logs), per_device_train_batch_size=settings.batch_size,
                          num_train_epochs=settings.epochs, max_steps=settings.max_steps or -1, beta=settings.beta,
                          max_length=context_length(policy), **config)
        trainer = trainer_cls(model=policy, ref_model=None if settings.lora else copy.deepcopy(policy), args=args,
                              train_dataset=dataset, processing_class=tokenizer,
                              peft_config=_lora_config(policy, settings) if settings.lora else None)
        _callbacks(trainer, progress, "policy", logs, trainer_cls.__name__.removesuffix("Trainer").lower())
        result = trainer.train()
        _save_policy(trainer.model, tokenizer, out_dir, policy_dir, settings)
        ranks = distributed.rank_metrics(trainer.model, result.global_step)
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
    result, log, rows, ranks = _offline(DPOTrainer, DPOConfig, policy_dir, train_pairs, ("prompt", "chosen", "rejected"),
                                 out_dir, settings, device, progress, logs, truncation_mode="keep_end")
    return {"algorithm": "dpo", "pairs": len(rows), "steps": result.global_step, "train_loss": round(result.training_loss, 4),
            "lora": settings.lora, **ranks, **_history(log, ("rewards/accuracies", "rewards/margins", "loss"))}


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
    result, log, rows, ranks = _offline(KTOTrainer, KTOConfig, policy_dir, train_examples, ("prompt", "completion", "label"),
                                 out_dir, settings, device, progress, logs, desirable_weight=1.0,
                                 undesirable_weight=max(0.5, min(2.0, positives / negatives)))
    return {"algorithm": "kto", "examples": len(rows), "positives": positives, "steps": result.global_step,
            "train_loss": round(result.training_loss, 4), "lora": settings.lora, **ranks,
            **_history(log, ("rewards/chosen_sum", "rewards/rejected_sum", "kl", "loss"))}


# ---------------------------------------------------------------------------- iterative DPO

def reward_ranked_pairs(prompts: list[list[dict]], answers: list[list[str]], scores: list[list[float]],
                        pairs_per_prompt: int, min_gap: float) -> tuple[list[dict], dict[str, Any]]:
    """Preference pairs from answers the reward model ranked: for each prompt, its best answer over its
    worst, the second best over the second worst, ... (``pairs_per_prompt``), each only where the
    scores differ by at least ``min_gap`` reward standard deviations (over all the scores) and the
    texts differ; an empty answer is never chosen. Returns the pairs (conversational rows, as
    rlhf.preference_data writes them) and what was kept."""
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
    from .evaluation import _sample  # the gate's sampler: stops at the end of a turn as serving does
    from .settings import EvalSettings

    settings.validate()
    dev = resolve_device(device)
    policy, tokenizer = _load_policy(policy_dir)
    policy.to(dev).eval()
    distinct = list({repr(p): p for p in prompts}.values())
    max_prompt = max(8, context_length(policy) - settings.response_length)
    texts = [_prompt_text_within(tokenizer, p, max_prompt) for p in distinct]
    n = settings.samples_per_prompt
    sampling = EvalSettings(max_new_tokens=settings.response_length, temperature=settings.temperature)
    report = progress or (lambda *a: None)
    answers: list[str] = []
    chunk = max(1, 64 // n)  # prompts per generate call
    torch.manual_seed(settings.seed)
    for i in range(0, len(texts), chunk):
        batch = [t for t in texts[i:i + chunk] for _ in range(n)]
        answers += _sample(policy, tokenizer, batch, sampling)[0]
        report("policy", 0, 1)  # sampling: the DPO steps report progress after it
    del policy
    reward = AutoModelForSequenceClassification.from_pretrained(str(reward_dir), num_labels=1)
    reward.config.pad_token_id = tokenizer.pad_token_id
    reward.to(dev).eval()
    end = end_of_turn_token(tokenizer) or tokenizer.eos_token
    with torch.no_grad():  # scored as the gate scores (rlhf.evaluation._scores)
        flat = score_texts(reward, tokenizer, [texts[j // n] + (" " + a if a else "") + end
                                               for j, a in enumerate(answers)])
    del reward
    grouped = [answers[j * n:(j + 1) * n] for j in range(len(texts))]
    scored = [flat[j * n:(j + 1) * n] for j in range(len(texts))]
    pairs, kept = reward_ranked_pairs(distinct, grouped, scored, settings.pairs_per_prompt, settings.min_pair_gap)
    if not pairs:
        raise ValueError(f"iterative DPO: the reward model ranked {len(answers)} sampled answers to "
                         f"{len(texts)} prompts and no two differed by {settings.min_pair_gap} standard deviations")
    dpo = replace(settings, batch_size=min(settings.batch_size, len(pairs)))
    metrics = train_dpo(policy_dir, pairs, out_dir, dpo, device, progress, logs)
    return {**metrics, "algorithm": "iterative_dpo", "sampled": kept}


# ---------------------------------------------------------------------------- RLOO

def _reward_function(reward: Any, tokenizer: Any) -> Callable[..., list[float]]:
    """The reward model as a TRL reward function. TRL's own path for a reward *model* tokenizes
    prompt + completion without truncation, which overruns the model's positions when a
    re-encoded completion comes out longer than it was generated; ``score_texts`` keeps the end
    of over-long texts (where the reward is read) and, like the reward model's training data,
    ends each text with the end-of-turn token (EOS without one)."""
    end = end_of_turn_token(tokenizer) or tokenizer.eos_token  # as the reward model's training texts end

    def reward_model_score(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return score_texts(reward, tokenizer, [p + c + end for p, c in zip(prompts, completions)])

    return reward_model_score


def _prompt_text_within(tokenizer: Any, messages: list[dict], max_tokens: int) -> str:
    """The prompt as text whose tokens fit ``max_tokens`` (RLOO takes text, not ids). Keeps the end
    of an over-long prompt. Decoding a cut through a multi-byte character gives U+FFFD, which
    encodes to more tokens than it came from, so the cut is checked by encoding it again."""
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = encode(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    keep = min(len(ids), max_tokens)
    while True:
        text = tokenizer.decode(ids[len(ids) - keep:]).lstrip("\ufffd")
        if len(encode(text)) <= max_tokens or keep <= 1:
            return text
        keep -= 1


def train_rloo(policy_dir: str | Path, reward_dir: str | Path, prompts: list[list[dict]], out_dir: str | Path,
               settings: PolicySettings = PolicySettings(), device: str = "auto",
               progress: ProgressFn | None = None, logs: Any = None) -> dict[str, Any]:
    """REINFORCE leave-one-out with the trained reward model as the reward function."""
    from trl import RLOOConfig, RLOOTrainer

    quiet_trl()
    settings.validate()
    dev = resolve_device(device)
    torch.manual_seed(settings.seed)
    policy, tokenizer = _load_policy(policy_dir)
    reward = AutoModelForSequenceClassification.from_pretrained(str(reward_dir), num_labels=1)
    reward.config.pad_token_id = tokenizer.pad_token_id
    max_prompt = max(8, context_length(policy) - settings.response_length)
    texts = [_prompt_text_within(tokenizer, p, max_prompt) for p in prompts]
    dataset = Dataset.from_list([{"prompt": t} for t in texts])
    steps = settings.max_steps or max(1, settings.episodes // settings.batch_size)
    with tempfile.TemporaryDirectory(prefix="rloo-") as scratch:
        args = RLOOConfig(**_common_args(dev, settings, scratch, logs), per_device_train_batch_size=settings.batch_size,
                          num_generations=settings.rloo_generations, max_completion_length=settings.response_length,
                          max_steps=steps, temperature=settings.temperature,
                          beta=settings.kl_coef)
        trainer = RLOOTrainer(model=policy, reward_funcs=_reward_function(reward.to(dev).eval(), tokenizer), args=args,
                              train_dataset=dataset, processing_class=tokenizer,
                              peft_config=_lora_config(policy, settings) if settings.lora else None)
        _callbacks(trainer, progress, "policy", logs, "rloo")
        result = trainer.train()
        _save_policy(trainer.model, tokenizer, out_dir, policy_dir, settings)
        log = trainer.state.log_history
        ranks = distributed.rank_metrics(trainer.model, result.global_step)
    return {"algorithm": "rloo", "prompts": len(texts), "steps": result.global_step, "lora": settings.lora, **ranks,
            **_history(log, ("reward", "kl", "loss"))}
