"""Loading models through the ordinary ``from_pretrained`` path, with errors a person can act on."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf.models.adapters import base_of, is_adapter, merged_model
from rlhf.models.chat_format import prepare_model_and_tokenizer, render_prompt

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message is one line and names what to fix."""


def resolve_device(setting: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else CPU. ``cuda`` without a GPU is an error."""
    setting = (setting or "auto").lower()
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"RLHF_DEVICE={setting!r} but no CUDA device is available; use auto or cpu")
    return torch.device(setting)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def gguf_file(source: str | Path, setting: str = "model") -> tuple[str, str] | None:
    """(folder, file name) when ``source`` is a GGUF file -- the format Ollama, llama.cpp and LM Studio
    keep models in -- or a folder holding one (and no ``config.json``); None otherwise. A folder with
    several is an error naming them: which one is the operator's choice."""
    path = Path(str(source)).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return str(path.parent), path.name
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(f.name for f in path.iterdir() if f.suffix.lower() == ".gguf" and f.is_file())
        if len(found) > 1:
            shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
            raise ModelLoadError(f"{setting}={str(source)!r} holds {len(found)} GGUF files ({shown}): name one of "
                                 "them")
        if found:
            return str(path), found[0]
    return None


def _load_gguf(folder: str, name: str, source: str | Path, setting: str, dtype: torch.dtype | None) -> tuple[Any, Any]:
    """A GGUF model through transformers' GGUF support, dequantized: a plain model that saves as one.
    transformers marks it quantized (``hf_quantizer``, ``config.quantization_config``) although its
    weights are ordinary float tensors after loading, and then refuses ``save_pretrained``."""
    from transformers.utils import is_gguf_available

    if not is_gguf_available():
        raise ModelLoadError(f"{setting}={str(source)!r} is a GGUF file: reading one needs the gguf package "
                             "(pip install gguf)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype or torch.float32)
    except Exception as exc:  # a file of any bytes: a reader's error of any kind (struct.error, ...) means unreadable
        raise ModelLoadError(f"{setting}={str(source)!r} could not be loaded as GGUF: {_one_line(exc)}") from exc
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def load_causal_lm(source: str | Path, device: torch.device | str = "cpu", setting: str = "model",
                   dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a hub id, a directory or a GGUF file (or a folder holding one), in eval
    mode on ``device``. A LoRA adapter version (rlhf.models.adapters) loads as its base with the
    adapter merged: a plain model.

    ``setting`` names where ``source`` came from, so the error tells the operator what to fix.
    """
    gguf = gguf_file(source, setting)
    if gguf is not None:
        model, tokenizer = _load_gguf(*gguf, source, setting, dtype)
        return _ready(model, tokenizer, source, setting, device)
    looks_local = str(source).startswith(("/", ".", "~")) or Path(str(source)).exists()
    if looks_local and not Path(str(source)).expanduser().is_dir():
        raise ModelLoadError(f"{setting}={str(source)!r} could not be loaded: no such directory or GGUF file")
    if looks_local and is_adapter(source):  # a LoRA version: its base with the adapter merged in
        try:
            base = base_of(source)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"{setting}={str(source)!r} could not be loaded: {_one_line(exc)}") from exc
        if is_adapter(base):
            raise ModelLoadError(f"{setting}={str(source)!r}: its base {str(base)!r} is itself an adapter")
        model, tokenizer = load_causal_lm(base, "cpu", setting=f"{setting} (base of {Path(str(source)).name})",
                                          dtype=dtype)
        try:
            model = merged_model(model, source)
        except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
            raise ModelLoadError(f"{setting}={str(source)!r} could not be loaded: {_one_line(exc)}") from exc
        model.to(device)
        model.eval()
        return model, tokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype or torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:  # corrupt weights: SafetensorError
        hint = "" if Path(str(source)).exists() else " (not a local directory; hub ids need internet access)"
        raise ModelLoadError(f"{setting}={str(source)!r} could not be loaded{hint}: {_one_line(exc)}") from exc
    return _ready(model, tokenizer, source, setting, device)


def _ready(model: Any, tokenizer: Any, source: str | Path, setting: str,
           device: torch.device | str) -> tuple[Any, Any]:
    try:
        prepare_model_and_tokenizer(model, tokenizer)
    except ValueError as exc:  # no EOS
        raise ModelLoadError(f"{setting}={str(source)!r} cannot be used: {_one_line(exc)}") from exc
    model.to(device)
    model.eval()
    return model, tokenizer


def _gguf_config(gguf: tuple[str, str], source: str, setting: str) -> Any:
    from transformers import AutoConfig
    from transformers.utils import is_gguf_available

    if not is_gguf_available():
        raise ModelLoadError(f"{setting}={source!r} is a GGUF file: reading one needs the gguf package "
                             "(pip install gguf)")
    try:
        return AutoConfig.from_pretrained(gguf[0], gguf_file=gguf[1])
    except Exception as exc:  # as in _load_gguf
        raise ModelLoadError(f"{setting}={source!r} could not be loaded as GGUF: {_one_line(exc)}") from exc


def _check_architecture(source: str, setting: str) -> None:
    """The model type must have a causal-LM class (the policy) and a sequence-classification class
    (the reward and value models start from the policy's backbone)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    local = Path(str(source)).expanduser()
    gguf = gguf_file(source, setting)
    if gguf is None and (str(source).startswith(("/", ".", "~")) or local.exists()) \
            and (not local.is_dir() or is_adapter(local)):
        return  # load_causal_lm says what is wrong with such a directory
    try:
        model_type = (_gguf_config(gguf, source, setting) if gguf
                      else AutoConfig.from_pretrained(str(source))).model_type
    except (OSError, ValueError, KeyError) as exc:
        hint = "" if Path(str(source)).exists() else " (not a local directory; hub ids need internet access)"
        raise ModelLoadError(f"{setting}={source!r} could not be loaded{hint}: {_one_line(exc)}") from exc
    for names, what, needed in ((MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "causal-LM class (AutoModelForCausalLM)",
                                 "to generate answers"),
                                (MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
                                 "sequence-classification class (AutoModelForSequenceClassification)",
                                 "for the reward model")):
        if model_type not in names:
            raise ModelLoadError(f"{setting}={source!r} cannot be used: model type {model_type!r} has no {what}, "
                                 f"which this app needs {needed}")


def _check_chat_template(tokenizer: Any, source: str, setting: str) -> None:
    """The chat template must render a user/assistant conversation, and the prompt with its
    generation prompt must be the start of the conversation with the answer: training cuts each
    answer off the conversation's text there."""
    prompt = [{"role": "user", "content": "Hello?"}]
    try:
        before = render_prompt(tokenizer, prompt)
        after = tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": "Hi."}], tokenize=False)
    except Exception as exc:  # jinja errors of every kind: the template is the model's
        raise ModelLoadError(f"{setting}={source!r} cannot be used: its chat template cannot render a "
                             f"user/assistant conversation ({_one_line(exc)})") from exc
    if not after.startswith(before):
        raise ModelLoadError(f"{setting}={source!r} cannot be used: its chat template's generation prompt is not "
                             "the start of the answered conversation, so answers cannot be cut out for training")


def import_pretrained(source: str, out_dir: str | Path, setting: str = "RLHF_BASE_MODEL") -> dict:
    """Copy a hub/local model (or a GGUF file, dequantized: :func:`gguf_file`) into the store as a
    plain chat- and PPO-ready version: adds a pad token
    distinct from EOS (resizing embeddings only when it does not fit), left padding and a chat
    template when missing; a model's own template is kept. What cannot work fails here, with one
    line naming what is missing (:class:`ModelLoadError`): no causal-LM or sequence-classification
    class for its architecture, no EOS token, a chat template that cannot render a conversation."""
    _check_architecture(source, setting)
    model, tokenizer = load_causal_lm(source, "cpu", setting=setting)
    _check_chat_template(tokenizer, source, setting)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"source": source, "parameters": sum(p.numel() for p in model.parameters())}


def context_length(model: Any, default: int = 1024) -> int:
    """How many positions ``model`` attends over (its config's name for it varies by family)."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(model.config, attr, None)
        if isinstance(value, int):
            return value
    return default


def length_within(max_length: int, *models: Any) -> int:
    """The most tokens of prompt + answer to read: ``max_length`` (0: no limit) within the context of
    every one of ``models``. The policy trains at this length and the gate reads at it, so both cut the
    same start of a long history (rlhf.settings.PolicySettings.max_length)."""
    context = min(context_length(m) for m in models)
    return min(context, max_length) if max_length else context


def answer_length(model: Any, wanted: int, prompt_floor: int = 8) -> int:
    """At most ``wanted`` new tokens, leaving at least ``prompt_floor`` positions for the prompt: a
    length setting of a large model applied to a small context must not run past its positions."""
    return max(1, min(wanted, context_length(model) - prompt_floor))
