"""One request as the generation layers hand it out (a row of the batch): prompt, settings, and
the answer decoded so far.

A row decodes its tokens incrementally and puts text on its queue only once it cannot be the
start of a stop string (``stop_prefix_len``, ``turn_markers_of``), then a ``Done`` saying how
it ended, or the worker's error. The in-process batching worker (``batcher``) and the inference
server's worker (``remote``) both answer through rows, so both cut stop strings the same way.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

import torch

from rlhf.generation.pool import GenerationSettings
from rlhf.models.chat_format import STOP_STRINGS, turn_markers


def stop_prefix_len(text: str, stops: tuple[str, ...] = STOP_STRINGS) -> int:
    """Length of the longest suffix of ``text`` that could begin a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if stop.startswith(text[-n:]):
                best = max(best, n)
                break
    return best


def turn_markers_of(tokenizer: Any) -> tuple[tuple[str, ...], frozenset[int]]:
    """``turn_markers`` of a loaded tokenizer, worked out once per tokenizer object (kept on it:
    rendering the template for every request would cost more than a token)."""
    markers = getattr(tokenizer, "_rlhf_turn_markers", None)
    if markers is None or markers[0] != tokenizer.chat_template:
        markers = (tokenizer.chat_template, turn_markers(tokenizer))
        tokenizer._rlhf_turn_markers = markers
    return markers[1]


@dataclass
class Done:
    token_count: int
    finish: str
    text: str


class Row:
    """One request: prompt, settings, and (worker side) the answer decoded so far. Text that is
    safe to show goes into ``out`` as it is decoded; then a ``Done`` or the worker's error."""

    def __init__(self, prompt_ids: list[int], settings: GenerationSettings, cancel: threading.Event,
                 tokenizer: Any) -> None:
        self.stops, self.ends = turn_markers_of(tokenizer)
        self.prompt_ids = prompt_ids
        self.settings = settings
        self.cancel = cancel
        self.tok = tokenizer
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.finished = threading.Event()
        self.done: Done | None = None
        self.ids: list[int] = []
        self.text = ""  # decoded answer so far (leading space stripped, stop string cut off)
        self.continues = False  # continuing an answer in the prompt: its first piece's leading space is kept
        self.emitted = 0  # len(text) already handed out
        self.finish: str | None = None
        self.generator: torch.Generator | None = None  # a seeded row's own (made by the worker)
        self._prefix = 0  # incremental decoding: ids[_prefix:_read] is the context of the next piece
        self._read = 0

    def _piece(self, final: bool = False) -> str:
        """The text the tokens not decoded yet add ('' while a multi-byte character is incomplete,
        unless ``final``)."""
        ids, decode = self.ids, self.tok.decode
        if self._read >= len(ids):
            return ""
        before = decode(ids[self._prefix:self._read], skip_special_tokens=True) if self._read > self._prefix else ""
        now = decode(ids[self._prefix:], skip_special_tokens=True)
        if len(now) <= len(before) or (now.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(ids)
        return now[len(before):]

    def _add(self, piece: str) -> None:
        """Append decoded text: cut at a stop string, hand out what cannot be the start of one."""
        text = self.text + piece
        if not self.emitted and not self.continues:
            text = text.lstrip()  # answers start after "Assistant:" with a space
        # a stop string cannot start in text already handed out (that text never ends in a prefix of one)
        cut = min((i for i in (text.find(s, self.emitted) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.text, self.finish = text[:cut], "stop_string"
            return
        self.text = text
        safe = len(text) - stop_prefix_len(text, self.stops)  # hold back a tail that may begin a stop string
        if safe > self.emitted:
            self.out.put(text[self.emitted:safe])
            self.emitted = safe

    def take(self, token_id: int) -> None:
        """Add one generated token: hand out the text that is safe to show, note why it ends."""
        self.ids.append(token_id)
        if token_id in self.ends:  # EOS or the chat template's end-of-turn token
            self.finish = "eos"
            return
        piece = self._piece()
        if piece:
            self._add(piece)
            if self.finish:
                return
        if len(self.ids) >= self.settings.max_new_tokens:
            self.finish = "length"

    def close(self, finish: str | None = None) -> None:
        """The row is finished: hand out the held-back text, then how it ended."""
        if self.finished.is_set():
            return
        if finish is not None:
            self.finish = finish
        if self.finish != "stop_string":
            piece = self._piece(final=True)  # bytes of an incomplete character, as decode() shows them
            if piece:
                reason = self.finish
                self._add(piece)
                if self.finish != "stop_string":
                    self.finish = reason
        text = self.text.rstrip()
        if len(text) > self.emitted:
            self.out.put(text[self.emitted:])
        self.done = Done(len(self.ids), self.finish or "eos", text)
        self.finished.set()
        self.out.put(self.done)

    def fail(self, exc: BaseException) -> None:
        if not self.finished.is_set():
            self.finished.set()
            self.out.put(exc)
