"""Model families people deploy, built locally: random weights at a family's real configuration or
at a tiny one, with a tokenizer shaped like the family's real one (its special tokens, pad/EOS
rules and chat template). The hub is never needed.

The tokenizer is a small byte-level BPE trained on the project's corpus (``rlhf.data.corpus``), with the
family's special tokens added as in its published tokenizer:

- ``gpt2`` (GPT-2): ``<|endoftext|>`` as BOS/EOS/UNK (the last id, as in GPT-2), no pad token, no chat template.
- ``phi`` (Phi-2, ``PhiForCausalLM``): the same shape as GPT-2 (its tokenizer is CodeGen's GPT-2 BPE).
- ``gpt_neox`` (Pythia): ``<|endoftext|>`` as BOS/EOS/UNK (id 0), ``<|padding|>`` (id 1) in the vocabulary but not
  the pad token, no chat template.
- ``qwen2`` (Qwen2.5-Instruct): ChatML, ``<|im_end|>`` as EOS, ``<|endoftext|>`` as pad, no BOS, and
  Qwen's own template with its default system prompt.
- ``llama`` (Llama-3-Instruct): ``<|begin_of_text|>`` as BOS (the tokenizer adds it, as Llama-3's
  does), ``<|end_of_text|>`` as EOS, no pad, and the Llama-3 template whose turns end with
  ``<|eot_id|>`` -- an end-of-turn token that is *not* EOS (as in Meta-Llama-3-8B-Instruct's
  first release), so nothing can rely on EOS alone.

Like several real checkpoints (Phi-2: 51,200 embeddings for 50,295 tokens; Pythia, Qwen2.5), the
phi, gpt_neox and qwen2 models have more embedding rows than tokens (rounded up to a multiple of 64).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from rlhf.data.corpus import generate_corpus

FAMILIES: tuple[str, ...] = ("gpt2", "phi", "llama", "qwen2", "gpt_neox")

Size = Literal["tiny", "real"]

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Qwen2.5-Instruct's chat template as published (tools included).
QWEN2_CHAT_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- '" + QWEN_SYSTEM + "' }}\n"
    "    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\n" + QWEN_SYSTEM + "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)

# Meta-Llama-3-8B-Instruct's chat template as published.
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TokenizerShape:
    """A family's special tokens (in vocabulary order), their roles and its chat template."""

    special: tuple[str, ...]
    eos: str
    bos: str | None = None
    pad: str | None = None
    unk: str | None = None
    chat_template: str | None = None
    add_bos: bool = False  # the tokenizer itself prepends BOS (Llama-3's post-processor)
    end_of_turn: str | None = None  # what ends an assistant turn in the template (None: EOS)
    pad_vocab_to: int = 1  # embedding rows rounded up to a multiple of this


SHAPES: dict[str, TokenizerShape] = {
    "gpt2": TokenizerShape(("<|endoftext|>",), eos="<|endoftext|>", bos="<|endoftext|>", unk="<|endoftext|>"),
    "phi": TokenizerShape(("<|endoftext|>",), eos="<|endoftext|>", bos="<|endoftext|>", unk="<|endoftext|>",
                          pad_vocab_to=64),
    "gpt_neox": TokenizerShape(("<|endoftext|>", "<|padding|>"), eos="<|endoftext|>", bos="<|endoftext|>",
                               unk="<|endoftext|>", pad_vocab_to=64),
    "qwen2": TokenizerShape(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), eos="<|im_end|>", pad="<|endoftext|>",
                            chat_template=QWEN2_CHAT_TEMPLATE, end_of_turn="<|im_end|>", pad_vocab_to=64),
    "llama": TokenizerShape(("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"), eos="<|end_of_text|>", bos="<|begin_of_text|>",
                            chat_template=LLAMA3_CHAT_TEMPLATE, add_bos=True, end_of_turn="<|eot_id|>"),
}

# The real checkpoint each family's "real" size copies (architecture sizes; random weights).
REAL_CHECKPOINTS = {"gpt2": "gpt2 (124 M)", "phi": "microsoft/phi-1_5 (1.4 B)",
                    "llama": "HuggingFaceTB/SmolLM2-135M (Llama architecture)",
                    "qwen2": "Qwen/Qwen2.5-0.5B-Instruct", "gpt_neox": "EleutherAI/pythia-160m"}

_REAL: dict[str, dict[str, Any]] = {
    "gpt2": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
    "phi": dict(vocab_size=51200, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                num_attention_heads=32, max_position_embeddings=2048, partial_rotary_factor=0.5,
                layer_norm_eps=1e-5, hidden_act="gelu_new"),
    "llama": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5,
                  tie_word_embeddings=True, rope_theta=100000.0),
    "qwen2": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, rope_theta=1000000.0, use_sliding_window=False),
    "gpt_neox": dict(vocab_size=50304, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                     num_attention_heads=12, max_position_embeddings=2048, rotary_pct=0.25,
                     use_parallel_residual=True, tie_word_embeddings=False),
}

# Tiny: every architectural feature the real one has (grouped-query attention, partial rotary,
# tied embeddings, ...), at a width and depth that trains in seconds.
_TINY: dict[str, dict[str, Any]] = {
    "gpt2": dict(n_positions=256, n_embd=32, n_layer=2, n_head=2),
    "phi": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=256, partial_rotary_factor=0.5, layer_norm_eps=1e-5, hidden_act="gelu_new"),
    "llama": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "qwen2": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  use_sliding_window=False),
    "gpt_neox": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                     max_position_embeddings=256, rotary_pct=0.25, use_parallel_residual=True,
                     tie_word_embeddings=False),
}


def _check(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r} (choose from {', '.join(FAMILIES)})")


def family_config(family: str, size: Size = "tiny", vocab_size: int | None = None, **overrides: Any) -> Any:
    """The ``transformers`` config of ``family`` at ``size``: ``"real"`` is the architecture of the
    checkpoint in ``REAL_CHECKPOINTS`` (e.g. GPT-2 small's 124 M shape), ``"tiny"`` two layers 32 wide.
    ``vocab_size`` replaces the family's (the tiny default is the tokenizer's); ``overrides`` set
    any other field. Token ids (BOS/EOS/pad) are the caller's to set."""
    from transformers import AutoConfig

    _check(family)
    if size not in ("tiny", "real"):
        raise ValueError(f"unknown size {size!r} (tiny or real)")
    fields = dict(_REAL[family] if size == "real" else _TINY[family])
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    fields.update(overrides)
    if family == "gpt2":  # no dropout in a model meant to be measured
        fields.setdefault("resid_pdrop", 0.0)
        fields.setdefault("embd_pdrop", 0.0)
        fields.setdefault("attn_pdrop", 0.0)
    return AutoConfig.for_model(family, **fields)


@lru_cache(maxsize=1)
def _corpus_texts() -> tuple[str, ...]:
    return tuple(m["content"] for d in generate_corpus(300, seed=0) for m in d.messages)


def build_tokenizer(family: str, vocab_size: int = 500) -> Any:
    """A ``PreTrainedTokenizerFast`` shaped like ``family``'s (see the module docstring): byte-level
    BPE trained on the corpus, the family's special tokens, pad/EOS/BOS roles and chat template."""
    from transformers import PreTrainedTokenizerFast

    _check(family)
    shape = SHAPES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Pythia's special tokens are its first ids; the others' come after the BPE vocabulary
    first = family == "gpt_neox"
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(shape.special) if first else [],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(_corpus_texts()) + ["User: ", "Assistant: ", "system\n", "user\n", "assistant\n"] * 50,
                            trainer=trainer)
    if not first:
        tok.add_special_tokens(list(shape.special))
    if shape.add_bos:
        bos_id = tok.token_to_id(shape.bos)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{shape.bos} $A", pair=f"{shape.bos} $A {shape.bos} $B", special_tokens=[(shape.bos, bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=shape.eos, bos_token=shape.bos,
                                      pad_token=shape.pad, unk_token=shape.unk)
    if shape.chat_template:
        wrapped.chat_template = shape.chat_template
    return wrapped


def _pretrain(model: Any, tokenizer: Any, steps: int, seed: int) -> float:
    """``steps`` of next-token training on corpus dialogues rendered with the chat template the
    model will be served with (its own, or the plain one the app gives a tokenizer without one), so
    that it ends its answers with its end-of-turn token: a random model almost never writes it."""
    import torch

    from rlhf.models.chat_format import PLAIN_CHAT_TEMPLATE

    template = tokenizer.chat_template or PLAIN_CHAT_TEMPLATE
    texts = [tokenizer.apply_chat_template(list(d.messages), tokenize=False, chat_template=template)
             for d in generate_corpus(200, seed=seed + 1)]
    ids = [i for enc in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in enc]
    block = 64
    data = torch.tensor(ids[: len(ids) // block * block]).view(-1, block)
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        batch = data[torch.randint(0, len(data), (16,), generator=gen)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return round(loss.item(), 3)


def build_tiny_model(family: str, out_dir: str | Path, size: Size = "tiny", vocab_size: int = 500,
                     seed: int = 0, train_steps: int = 0, **overrides: Any) -> dict:
    """Write a random-weight ``family`` model at ``size`` and its family-shaped tokenizer to
    ``out_dir`` with ``save_pretrained`` (plus a generation config with the family's end ids), as
    a hub download would look. ``vocab_size``: the BPE's size; the model's embeddings are the
    tokenizer's length (rounded up where the real family rounds), or the real vocabulary for
    ``size="real"``. ``train_steps``: next-token steps on the corpus in its chat format first (the
    tests use a few hundred so that answers end; 0: random weights). Returns what was built
    (family, architecture, parameters, special ids, final training loss)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    _check(family)
    shape = SHAPES[family]
    tokenizer = build_tokenizer(family, vocab_size)
    rows = -(-len(tokenizer) // shape.pad_vocab_to) * shape.pad_vocab_to
    if size == "real":
        rows = max(rows, _REAL[family]["vocab_size"])
    ids = {role: tokenizer.convert_tokens_to_ids(t) for role, t in
           (("bos", shape.bos), ("eos", shape.eos), ("pad", shape.pad), ("end_of_turn", shape.end_of_turn)) if t}
    config = family_config(family, size, vocab_size=rows, bos_token_id=ids.get("bos"), eos_token_id=ids["eos"],
                           pad_token_id=ids.get("pad"), **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    loss = _pretrain(model, tokenizer, train_steps, seed) if train_steps else None
    ends = list(dict.fromkeys(i for i in (ids.get("end_of_turn"), ids["eos"]) if i is not None))
    model.generation_config = GenerationConfig(bos_token_id=ids.get("bos"), pad_token_id=ids.get("pad"),
                                               eos_token_id=ends if len(ends) > 1 else ends[0])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {"family": family, "size": size, "architecture": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()), "tokens": len(tokenizer),
            "embedding_rows": rows, "special_ids": ids, "chat_template": bool(shape.chat_template),
            "train_steps": train_steps, "train_loss": loss}
    (out / "family.json").write_text(json.dumps(info, indent=1))
    return info
