"""Chat formatting rules shared by generation, training and the embedded model.

Every model goes through ``tokenizer.apply_chat_template``. Models without a template of their
own (GPT-2 and most small base models) get the plain "User: ...\\nAssistant: ..." template
below. TRL's PPO additionally needs a pad token distinct from EOS and left padding.
"""
from __future__ import annotations

from typing import Any

# One line per turn; each assistant turn ends with EOS so the model learns to stop. The
# generation prompt ends with "Assistant:" and answers start with a space, which byte-level
# BPE tokenizes the same way at training and at generation time.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n' }}"
    "{% else %}{{ 'Assistant: ' + message['content'] + eos_token + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# Generation also stops where the model starts writing the user's next turn.
STOP_STRINGS: tuple[str, ...] = ("\nUser:",)

PAD_TOKEN = "<|pad|>"


def prepare_tokenizer(tokenizer: Any) -> bool:
    """Make ``tokenizer`` usable for chat + PPO in place. Returns True if a token was added
    (the model's embeddings must then be resized)."""
    added = False
    if tokenizer.eos_token is None:
        raise ValueError("the tokenizer has no EOS token, so generation could never stop")
    if tokenizer.pad_token is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        added = tokenizer.add_special_tokens({"pad_token": PAD_TOKEN}) > 0
    tokenizer.padding_side = "left"
    tokenizer.init_kwargs["padding_side"] = "left"  # so save_pretrained keeps it
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return added


def prepare_model_and_tokenizer(model: Any, tokenizer: Any) -> None:
    """Apply :func:`prepare_tokenizer` and keep the model's embeddings and config in step."""
    if prepare_tokenizer(tokenizer):
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id


def render_prompt(tokenizer: Any, messages: list[dict]) -> str:
    """The conversation as text, ending with the assistant generation prompt."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
