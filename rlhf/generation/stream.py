"""The streaming layer: one answer as a stream of text chunks that owns its final result.

``stream_chat`` fits the conversation into the model's context (``pool.fit_to_context``), hands it
to the model's batching worker (``batcher``) and returns a ``StreamHandle`` at once. Iterating the
handle's ``chunks`` yields the answer's text as the worker decodes it. The handle reads the
worker's messages itself and, when the stream ends, keeps the answer's ``GenerationResult`` (text,
token count, finish reason, timings) as its ``result``: on the worker's end of the answer, or when
the reader closes ``chunks`` early (the answer is stopped and what was handed out is kept). After a
worker error, which ``chunks`` raises, ``result`` stays None.

``generate_chat`` and ``generate_chats`` read whole answers through the same streams.

A ``remote.RemoteModel`` (a version served by an inference server) goes through the same
handle: its rows are submitted to a ``remote.RemoteWorker`` instead of the batching worker.
``stream_prompt`` starts an answer from prompt token ids (``openai_server`` serves it).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

from rlhf.generation.batcher import _Batcher, batcher_for
from rlhf.generation.pool import GenerationResult, GenerationSettings, LoadedModel, fit_to_context
from rlhf.generation.remote import RemoteModel, RemoteWorker, remote_worker
from rlhf.generation.rows import Done, Row

RESULT_TIMEOUT_S = 600.0  # a reader gives up on a worker that sends nothing for this long


class _Chunks:
    """The text chunks of one answer (an iterator with ``close``, like a generator). Closing it,
    even before the first chunk, stops the answer and keeps what was handed out."""

    def __init__(self, handle: "StreamHandle") -> None:
        self._handle = handle
        self._gen = handle._read()
        self._begun = False

    def __iter__(self) -> "_Chunks":
        return self

    def __next__(self) -> str:
        self._begun = True
        return next(self._gen)

    def close(self) -> None:
        if not self._begun:
            self._begun = True
            self._handle._abandon("", None)
        self._gen.close()

    def __del__(self) -> None:  # dropped unread (the client went away before the first chunk)
        row = self._handle._row
        if not row.finished.is_set():
            row.cancel.set()


class StreamHandle:
    """One answer being generated. Iterate ``chunks`` to receive its text; ``result`` is None
    while it streams and the answer's ``GenerationResult`` once the iteration has ended (or
    ``chunks`` was closed). Setting ``cancel`` stops the answer (the stop button)."""

    def __init__(self, loaded: LoadedModel, prompt_ids: list[int], settings: GenerationSettings,
                 cancel: threading.Event, started: float) -> None:
        self.cancel = cancel
        self._started = started
        self._row = Row(prompt_ids, settings, cancel, loaded.tokenizer)
        self._batcher: _Batcher | RemoteWorker = (remote_worker(loaded) if isinstance(loaded, RemoteModel)
                                                  else batcher_for(loaded))
        self._result: GenerationResult | None = None
        self.chunks: _Chunks = _Chunks(self)

    @property
    def result(self) -> GenerationResult | None:
        """The finished answer, set by this stream itself when it ends."""
        return self._result

    def _start(self) -> None:
        self._batcher.submit(self._row)

    def _ms(self) -> float:
        return (time.perf_counter() - self._started) * 1000

    def _finish(self, text: str, token_count: int, first_token_ms: float | None, finish_reason: str) -> None:
        self._result = GenerationResult(
            text=text.strip(), token_count=token_count, latency_ms=self._ms(), first_token_ms=first_token_ms,
            stopped=finish_reason == "cancelled", finish_reason=finish_reason)

    def _abandon(self, said: str, first_token_ms: float | None) -> None:
        """The reader went away: stop the row, keep what was handed out."""
        row = self._row
        row.cancel.set()
        self._batcher.withdraw(row)
        row.finished.wait(RESULT_TIMEOUT_S)  # a running row: the worker drops it at its next step
        self._finish(said, len(row.ids) if row.done is None else row.done.token_count, first_token_ms, "cancelled")

    def _read(self) -> Iterator[str]:
        """The chunks of the answer, read from the row's queue; sets ``result`` when it ends."""
        out = self._row.out
        said: list[str] = []
        first_token_ms = None
        try:
            while True:
                try:
                    item = out.get(timeout=RESULT_TIMEOUT_S)
                except queue.Empty:
                    raise TimeoutError("the generation worker sent nothing for "
                                       f"{RESULT_TIMEOUT_S:.0f} s") from None
                if isinstance(item, str):
                    parts = [item]  # hand out everything decoded meanwhile as one chunk
                    while True:
                        try:
                            item = out.get_nowait()
                        except queue.Empty:
                            item = None
                            break
                        if not isinstance(item, str):
                            break
                        parts.append(item)
                    chunk = "".join(parts)
                    if first_token_ms is None:
                        first_token_ms = self._ms()
                    said.append(chunk)  # counted as said before it is handed out
                    yield chunk
                    if item is None:
                        continue
                if isinstance(item, Done):
                    self._finish(item.text, item.token_count, first_token_ms, item.finish)
                    return
                raise item  # the worker's error
        except GeneratorExit:  # the consumer went away (client disconnected): keep the partial answer
            self._abandon("".join(said), first_token_ms)
            raise


def stream_chat(loaded: LoadedModel, messages: list[dict], settings: GenerationSettings,
                cancel: threading.Event | None = None) -> StreamHandle:
    """Start generating an answer to ``messages`` (in the model's batching worker) and return a
    handle whose ``chunks`` yields text as it is produced. Generation ends at EOS, at the start
    of a new turn (the template's role markers, ``turn_markers``), at ``max_new_tokens`` or when ``cancel`` is set.
    ``token_count`` counts the generated tokens, including the EOS or the one that completed a
    stop string; ``latency_ms`` runs from this call to the end of the answer."""
    started = time.perf_counter()
    settings.validate()
    return stream_prompt(loaded, fit_to_context(loaded, messages, settings.max_new_tokens), settings, cancel,
                         started)


def stream_prompt(loaded: LoadedModel, prompt_ids: list[int], settings: GenerationSettings,
                  cancel: threading.Event | None = None, started: float | None = None, *,
                  extra_stops: tuple[str, ...] = (), extra_end_ids: tuple[int, ...] = (),
                  continues: bool = False) -> StreamHandle:
    """``stream_chat`` for a prompt already rendered and tokenized (the caller fits it to the
    context window). ``extra_stops`` / ``extra_end_ids`` end the answer too, besides the chat
    template's own turn markers. ``continues``: the prompt ends inside an answer (``render_prompt``
    of a conversation whose last message is the assistant's), so the text is its continuation and
    keeps its leading space ("Paris" + " is ...")."""
    settings.validate()
    handle = StreamHandle(loaded, list(prompt_ids), settings, cancel or threading.Event(),
                          time.perf_counter() if started is None else started)
    row = handle._row
    row.continues = continues
    if extra_stops:
        row.stops = tuple(dict.fromkeys((*row.stops, *(s for s in extra_stops if s))))
    if extra_end_ids:
        row.ends = row.ends | frozenset(extra_end_ids)
    handle._start()
    return handle


def generate_chat(loaded: LoadedModel, messages: list[dict], settings: GenerationSettings) -> GenerationResult:
    """Non-streaming convenience: the whole answer at once."""
    return generate_chats([(loaded, messages)], settings)[0]


def generate_chats(jobs: list[tuple[LoadedModel, list[dict]]], settings: GenerationSettings) -> list[GenerationResult]:
    """Several whole answers generated at the same time (sharing a batch where they share a model),
    e.g. the two sides of a comparison. If one fails, the others are stopped and the error raised."""
    handles = [stream_chat(loaded, messages, settings) for loaded, messages in jobs]
    try:
        for handle in handles:
            for _ in handle.chunks:
                pass
    except BaseException:
        for handle in handles:
            handle.chunks.close()
        raise
    assert all(h.result is not None for h in handles)
    return [h.result for h in handles]  # type: ignore[misc]
