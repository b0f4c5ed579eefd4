"""Loaded models and prompt fitting: the bottom layer of chat generation.

``ModelPool`` loads each model version once and keeps it in memory (control and variant side by
side); it is safe to share between request threads, and concurrent first uses of a version load it
once. A LoRA adapter version is served on its base version's loaded weights (``rlhf.models.adapters``).
``fit_to_context`` turns a conversation into prompt token ids that leave room for the answer in the
model's context window. ``GenerationSettings`` and ``GenerationResult`` are what a caller passes in
and gets back; the batching worker (``batcher``) and the streaming layer (``stream``) build on these.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlhf.models.chat_format import render_prompt
from rlhf.models.loading import load_causal_lm, resolve_device


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 80
    temperature: float = 0.8
    top_p: float = 0.95
    do_sample: bool = True
    seed: int | None = None  # a sampled answer's own random generator: the same seed, the same answer

    def validate(self) -> "GenerationSettings":
        if not 1 <= self.max_new_tokens <= 4096:
            raise ValueError("max_new_tokens must be between 1 and 4096")
        if self.do_sample and not 0 < self.temperature <= 5:
            raise ValueError("temperature must be in (0, 5]")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        return self


@dataclass
class LoadedModel:
    name: str
    model: Any
    tokenizer: Any
    device: torch.device

    @property
    def context_window(self) -> int:
        cfg = self.model.config
        for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
            if isinstance(getattr(cfg, attr, None), int):
                return getattr(cfg, attr)
        return 1024


@dataclass
class GenerationResult:
    text: str
    token_count: int
    latency_ms: float
    first_token_ms: float | None
    stopped: bool = False  # cancelled by the caller (stop button / disconnect)
    finish_reason: str = "eos"  # eos | stop_string | length | cancelled


class ModelPool:
    """Loaded models by path. ``get`` loads on first use; concurrent first uses load once."""

    def __init__(self, device: str = "auto") -> None:
        self.device = resolve_device(device)
        self._models: dict[str, LoadedModel] = {}
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    def get(self, path: str | Path, name: str | None = None) -> LoadedModel:
        key = str(path)
        if key in self._models:
            return self._models[key]
        with self._lock:
            lock = self._loading.setdefault(key, threading.Lock())
        with lock:
            if key not in self._models:
                self._models[key] = self._load(key, name or Path(key).name)
        return self._models[key]

    def _load(self, key: str, name: str) -> LoadedModel:
        """A full version gets its own weights; a LoRA adapter version is injected into its base
        version's loaded weights (loading the base if needed), which it shares (rlhf.models.adapters)."""
        from rlhf.models.adapters import SharedWeights, base_of, is_adapter
        from rlhf.models.loading import ModelLoadError

        if not is_adapter(key):
            model, tokenizer = load_causal_lm(key, self.device)
            return LoadedModel(name, SharedWeights(model).view(), tokenizer, self.device)
        base_dir = base_of(key)
        if is_adapter(base_dir) or not base_dir.is_dir():
            raise ModelLoadError(f"adapter version {name}: its base {str(base_dir)!r} is "
                                 + ("itself an adapter" if base_dir.is_dir() else "missing"))
        same = [k for k in list(self._models) if Path(k).resolve() == base_dir.resolve()]
        base = self.get(same[0] if same else base_dir)
        try:
            view = base.model.shared.attach(key, name)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelLoadError(f"adapter version {name} could not be loaded: {exc}") from exc
        return LoadedModel(name, view, base.tokenizer, self.device)

    def loaded(self) -> list[str]:
        return list(self._models)


def fit_to_context(loaded: LoadedModel, messages: list[dict], max_new_tokens: int) -> list[int]:
    """Prompt token ids for ``messages``, dropping the oldest turns until prompt + answer fit
    the context window. If even the last user turn alone is too long, its start is cut."""
    tok = loaded.tokenizer
    budget = max(8, loaded.context_window - max_new_tokens)
    msgs = list(messages)
    while True:
        ids = tok(render_prompt(tok, msgs), add_special_tokens=False)["input_ids"]
        if len(ids) <= budget:
            return ids
        if len(msgs) > 1:
            # drop the oldest exchange but keep any system message at the start
            start = 1 if msgs[0].get("role") == "system" else 0
            del msgs[start]
            continue
        # One message that does not fit: keep the generation prompt and the most recent text.
        return ids[-budget:]
