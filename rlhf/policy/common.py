"""What every policy trainer shares: loading the parent, TRL arguments, callbacks, LoRA and saving.

Every trainer takes the parent policy directory and writes the new policy to ``out_dir``: a plain
``save_pretrained`` directory, or with ``lora`` the LoRA adapter alone (peft's ``save_pretrained``),
whose ``base_model_name_or_path`` is the parent directory: served on top of the parent's loaded
weights (rlhf.models.adapters). ``lora_merge`` writes the merged model instead. Trainers never
change the parent; a failure leaves ``out_dir`` to be discarded by the caller.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf.progress import ProgressFn
from rlhf.settings import PolicySettings
from rlhf.training import distributed
from rlhf.training.trl_utils import ProgressCallback, attach_logs, drop_printer, report_to, training_precision


def callbacks(trainer: Any, progress: ProgressFn | None, stage: str, logs: Any = None, name: str = "") -> None:
    drop_printer(trainer)
    trainer.add_callback(ProgressCallback(progress, stage))
    attach_logs(trainer, logs, stage, name)


def lora_config(model: Any, settings: PolicySettings):
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


def save_policy(model: Any, tokenizer: Any, out_dir: str | Path, policy_dir: str | Path,
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


def history(log_history: list[dict], keys: tuple[str, ...]) -> dict[str, Any]:
    """First and last logged value of each metric (how it moved during training)."""
    out: dict[str, Any] = {}
    for key in keys:
        values = [row[key] for row in log_history if key in row]
        if values:
            out[key] = {"first": round(float(values[0]), 4), "last": round(float(values[-1]), 4)}
    return out


def common_args(dev: torch.device, settings: PolicySettings, scratch: str, logs: Any = None) -> dict[str, Any]:
    # no gradient checkpointing (TRL's default): it recomputes every forward pass in the backward one, a
    # third more compute to save activation memory that models of this size never run short of
    return dict(output_dir=scratch, learning_rate=settings.learning_rate, save_strategy="no", report_to=report_to(logs),
                gradient_checkpointing=False,
                disable_tqdm=True, logging_steps=1, seed=settings.seed, data_seed=settings.seed,
                use_cpu=dev.type == "cpu", dataloader_num_workers=0, **training_precision(dev))


def load_policy(policy_dir: str | Path) -> tuple[Any, Any]:
    tokenizer = AutoTokenizer.from_pretrained(str(policy_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(policy_dir))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def prompt_text_within(tokenizer: Any, messages: list[dict], max_tokens: int) -> str:
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
