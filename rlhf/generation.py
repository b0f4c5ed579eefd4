"""Chat generation: load a model version once, format with its chat template, stream tokens.

``ModelPool`` keeps every loaded version in memory (control and variant side by side) and is
safe to share between request threads: inference needs no locks, loading happens once.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

from .chat_format import STOP_STRINGS, render_prompt
from .loading import load_causal_lm, resolve_device


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 80
    temperature: float = 0.8
    top_p: float = 0.95
    do_sample: bool = True

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
        version's loaded weights (loading the base if needed), which it shares (rlhf.adapters)."""
        from .adapters import SharedWeights, base_of, is_adapter
        from .loading import ModelLoadError

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

    def evict(self, path: str | Path) -> None:
        self._models.pop(str(path), None)

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


class _CancelCriteria(StoppingCriteria):
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class _CountingStreamer(TextIteratorStreamer):
    """TextIteratorStreamer that also counts generated tokens and notes the first one."""

    def __init__(self, tokenizer, **kw) -> None:
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True, **kw)
        self.generated_ids: list[int] = []

    def put(self, value) -> None:
        if not (self.skip_prompt and self.next_tokens_are_prompt):
            self.generated_ids.extend(value.reshape(-1).tolist())
        super().put(value)


def _stop_prefix_len(text: str) -> int:
    """Length of the longest suffix of ``text`` that could begin a stop string."""
    best = 0
    for stop in STOP_STRINGS:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if stop.startswith(text[-n:]):
                best = max(best, n)
                break
    return best


@dataclass
class StreamHandle:
    """Iterate to receive text chunks; ``result`` is set when the iteration ends."""

    chunks: Iterator[str]
    cancel: threading.Event = field(default_factory=threading.Event)
    result: GenerationResult | None = None


def stream_chat(loaded: LoadedModel, messages: list[dict], settings: GenerationSettings,
                cancel: threading.Event | None = None) -> StreamHandle:
    """Start generating an answer to ``messages`` in a background thread and return a handle
    whose ``chunks`` yields text as it is produced. Generation ends at EOS, at the start of a
    new turn (``STOP_STRINGS``), at ``max_new_tokens`` or when ``cancel`` is set."""
    settings.validate()
    cancel = cancel or threading.Event()
    handle = StreamHandle(chunks=iter(()), cancel=cancel)
    tok = loaded.tokenizer
    prompt_ids = fit_to_context(loaded, messages, settings.max_new_tokens)
    input_ids = torch.tensor([prompt_ids], device=loaded.device)
    streamer = _CountingStreamer(tok, timeout=600)
    kwargs: dict[str, Any] = dict(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=settings.max_new_tokens,
        streamer=streamer, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        # Stop strings are matched on the streamed text below (which then sets ``cancel``):
        # much cheaper per token than transformers' StopStringCriteria.
        stopping_criteria=StoppingCriteriaList([_CancelCriteria(cancel)]))
    if settings.do_sample:
        kwargs.update(do_sample=True, temperature=settings.temperature, top_p=settings.top_p)
    else:
        kwargs.update(do_sample=False)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with torch.inference_mode():
                loaded.model.generate(**kwargs)
        except BaseException as exc:  # surfaced to the consumer below
            errors.append(exc)
            streamer.end()

    started = time.perf_counter()
    thread = threading.Thread(target=run, name="generate", daemon=True)
    thread.start()

    def finish_up(text: str, finish: str | None, first_token_ms: float | None, exhausted: bool) -> None:
        if not exhausted:
            cancel.set()  # stop the generating thread, then drain what it queued
        thread.join()
        if not exhausted:
            for _ in streamer:
                pass
        ids = streamer.generated_ids
        if finish is None:
            if cancel.is_set():
                finish = "cancelled"
            elif len(ids) >= settings.max_new_tokens and (not ids or ids[-1] != tok.eos_token_id):
                finish = "length"
            else:
                finish = "eos"
        handle.result = GenerationResult(
            text=text.strip(), token_count=len(ids), latency_ms=(time.perf_counter() - started) * 1000,
            first_token_ms=first_token_ms, stopped=finish == "cancelled", finish_reason=finish)

    def chunks() -> Iterator[str]:
        text, emitted, first_token_ms, finish, exhausted = "", 0, None, None, False
        try:
            for piece in streamer:
                if first_token_ms is None and piece:
                    first_token_ms = (time.perf_counter() - started) * 1000
                text += piece
                if not emitted:
                    text = text.lstrip()  # answers start after "Assistant:" with a space
                cut = min((i for i in (text.find(s) for s in STOP_STRINGS) if i >= 0), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop_string"
                    break
                # hold back a tail that may be the start of a stop string
                safe = len(text) - _stop_prefix_len(text)
                if safe > emitted:
                    chunk, emitted = text[emitted:safe], safe  # count it as said before handing it out
                    yield chunk
            else:
                exhausted = True
        except GeneratorExit:  # the consumer went away (client disconnected): keep the partial answer
            finish_up(text[:emitted], "cancelled", first_token_ms, exhausted=False)
            raise
        if errors:
            thread.join()
            raise errors[0]
        text = text.rstrip()
        if len(text) > emitted:
            yield text[emitted:]
        finish_up(text, finish, first_token_ms, exhausted)

    handle.chunks = chunks()
    return handle


def generate_chat(loaded: LoadedModel, messages: list[dict], settings: GenerationSettings) -> GenerationResult:
    """Non-streaming convenience: the whole answer at once."""
    handle = stream_chat(loaded, messages, settings)
    for _ in handle.chunks:
        pass
    assert handle.result is not None
    return handle.result
