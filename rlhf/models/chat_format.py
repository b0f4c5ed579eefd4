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

# Generation also stops where the model starts writing a new turn of either role (the plain
# template's role markers; other templates get theirs from ``turn_markers``).
STOP_STRINGS: tuple[str, ...] = ("\nUser:", "\nAssistant:")

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
    # Many checkpoints have more embedding rows than tokens (Phi-2: 51,200 for 50,295): an added pad
    # token usually fits, and resizing to len(tokenizer) would cut rows off the trained model.
    if prepare_tokenizer(tokenizer) and len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        ends = end_ids(tokenizer)  # EOS first, then the template's end-of-turn token (Llama-3's <|eot_id|>)
        model.generation_config.eos_token_id = ends if len(ends) > 1 else ends[0]


def render_prompt(tokenizer: Any, messages: list[dict]) -> str:
    """The conversation as text, ending with the assistant generation prompt -- or, when the last
    message is the assistant's, ending inside that answer (no end-of-turn after it), so that the
    model continues it (transformers' ``continue_final_message``, as vLLM and llama.cpp do for an
    OpenAI request whose last message is the assistant's)."""
    if messages and messages[-1].get("role") == "assistant":
        return tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


_PROBE = [{"role": "user", "content": "\x01u1"}, {"role": "assistant", "content": "\x01a1"},
          {"role": "user", "content": "\x01u2"}, {"role": "assistant", "content": "\x01a2"}]


def _template_gaps(tokenizer: Any) -> list[str] | None:
    """The text a chat template writes between an assistant answer and the next user turn, and
    between that user turn and the next answer (None if the template cannot render the probe)."""
    try:
        text = tokenizer.apply_chat_template(_PROBE, tokenize=False)
        a1, u2, a2 = (text.index(m) for m in ("\x01a1", "\x01u2", "\x01a2"))
    except Exception:  # templates that reject the probe conversation: the plain markers only
        return None
    return [text[a1 + 3:u2], text[u2 + 3:a2]]


def _specials(tokenizer: Any) -> list[str]:
    """Special and added tokens, longest first."""
    return sorted({t for t in (list(getattr(tokenizer, "all_special_tokens", []))
                               + [str(t) for t in getattr(tokenizer, "get_added_vocab", dict)()]) if t},
                  key=len, reverse=True)


def end_of_turn_token(tokenizer: Any) -> str | None:
    """The token the chat template writes right after an assistant answer (ChatML's ``<|im_end|>``,
    Llama-3's ``<|eot_id|>``, EOS in the plain template), or None when it writes no special token
    there (the answer then ends at EOS)."""
    gaps = _template_gaps(tokenizer)
    if gaps is None:
        return None
    first = next((t for t in _specials(tokenizer) if gaps[0].lstrip().startswith(t)), None)
    return None if first is None or first == getattr(tokenizer, "pad_token", None) else first


def end_of_turn_id(tokenizer: Any) -> int:
    """The id that ends an answer in training (PPO's stop token, the completions the reward model
    scores): the template's end-of-turn token, else EOS."""
    token = end_of_turn_token(tokenizer)
    return tokenizer.eos_token_id if token is None else tokenizer.convert_tokens_to_ids(token)


def end_ids(tokenizer: Any) -> list[int]:
    """EOS and the template's end-of-turn token: the ids a generation stops at (EOS first)."""
    return list(dict.fromkeys(i for i in (tokenizer.eos_token_id, end_of_turn_id(tokenizer)) if i is not None))


def turn_markers(tokenizer: Any) -> tuple[tuple[str, ...], frozenset[int]]:
    """What ends an answer for this tokenizer's chat template: the stop strings (role markers the
    template writes as plain text, e.g. "\nUser:" and "\nAssistant:") and the token ids of
    EOS, of the template's end-of-turn token (e.g. ChatML's ``<|im_end|>``) and of every other
    special token the template writes between turns (``<|im_start|>``, ``<|start_header_id|>``:
    a model that writes one has begun a new turn)."""
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gaps = _template_gaps(tokenizer)
    if gaps is None:
        return STOP_STRINGS, frozenset(eos)
    special = _specials(tokenizer)
    pad = getattr(tokenizer, "pad_token", None)
    stops: list[str] = []
    for gap in gaps:
        rest = gap
        for tok in special:
            if tok in rest:
                if tok != pad:
                    eos.add(tokenizer.convert_tokens_to_ids(tok))
                rest = rest.replace(tok, "")
        marker = rest.strip()
        # a plain-text role marker ("User:", "### Assistant:"): stop where a new line starts it
        if marker and ":" in marker and "\n" not in marker:
            stops.append("\n" + marker)
    return (tuple(dict.fromkeys(stops)) or STOP_STRINGS), frozenset(i for i in eos if isinstance(i, int))
