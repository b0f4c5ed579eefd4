"""The per-model batching worker: every answer in flight on one model is generated as one batch.

Every loaded model has one generation worker thread (started on first use, gone after
WORKER_IDLE_EXIT_S without work). The streaming layer (``stream``) submits a request as a ``Row``
and reads text from the row's own queue. The worker generates every request in flight as ONE
batch, joining and leaving at step boundaries ("continuous batching"):

- Requests that arrive while others generate are prefilled together (left padding plus an
  attention mask, so each row keeps its own positions) and their key/value caches join the
  running batch before its next step: nobody waits for the others to finish.
- Each step is one forward pass for all rows. Rows sample with their own settings (rows with
  identical settings are warped together, greedy rows take the argmax).
- A row ends on its own (EOS, a stop string, its max_new_tokens, cancel, the reader gone) and
  leaves the batch at once; the others carry on undisturbed.

On a CPU a forward pass costs about the same for 1 or 16 rows, so concurrent users share the
model's throughput instead of competing for it (and request threads do not fight over
torch's intra-op threads).

How a row decodes its tokens and cuts stop strings is ``rows``'s part.
"""
from __future__ import annotations

import inspect
import threading
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from transformers import DynamicCache, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.cache_utils import DynamicLayer

from rlhf.generation.pool import LoadedModel
from rlhf.generation.rows import Row

MAX_BATCH_ROWS = 32  # further requests wait for a free row
WORKER_IDLE_EXIT_S = 60.0  # an idle worker exits; the next request starts a new one
DEFAULT_TOP_K = 50  # what model.generate() applies when the model's generation config has no top_k


@dataclass
class BatchStats:
    """What a model's worker did (tests and benchmarks read it)."""

    prefills: int = 0  # forward passes over new requests' prompts
    steps: int = 0  # forward passes that advanced the running rows by one token
    rows_stepped: int = 0  # sum of the batch sizes of those steps
    max_rows: int = 0  # the largest batch stepped together
    requests: int = 0  # requests started


class _Batch:
    """The rows generating together and their shared key/value cache. Row i's tokens sit at the
    right end of ``mask[i]`` (left padding); ``nxt[i]`` is its sampled token not yet fed in."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [rows, cached positions]
        self.nxt: torch.Tensor | None = None  # [rows, 1]
        self.joinable = True  # new rows can join mid-flight (a plain DynamicCache)


def _joinable(cache: Any) -> bool:
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _left_pad(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` ([batch, heads, seq, dim] or [batch, seq]) with ``n`` zero positions prepended."""
    if n == 0:
        return x
    return torch.nn.functional.pad(x, (0, 0, n, 0) if x.dim() == 4 else (n, 0))


class _Batcher:
    """The generation worker of one loaded model (see the module docstring)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.stats = BatchStats()
        self._cond = threading.Condition()
        self._pending: deque[Row] = deque()
        self._thread: threading.Thread | None = None
        self._held = 0
        model, tok = loaded.model, loaded.tokenizer
        params = inspect.signature(model.forward).parameters
        self._position_ids = "position_ids" in params
        self._logits_to_keep = "logits_to_keep" in params
        top_k = getattr(getattr(model, "generation_config", None), "top_k", None)
        self._top_k = DEFAULT_TOP_K if top_k is None else int(top_k)
        self._pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        self._warpers: dict[tuple, list] = {}

    def submit(self, row: Row) -> None:
        with self._cond:
            self._pending.append(row)
            self.stats.requests += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"generate-{self.loaded.name}", daemon=True)
                self._thread.start()
            self._cond.notify()

    def withdraw(self, row: Row) -> None:
        """Finish ``row`` as cancelled at once if it has not started yet (else the worker drops
        it at its next step)."""
        with self._cond:
            try:
                self._pending.remove(row)
            except ValueError:
                return
        row.close("cancelled")

    @contextmanager
    def held(self) -> Iterator[None]:
        """Requests submitted inside the block start together when it ends (tests)."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify()

    # -- the worker thread

    def _admit(self, batch: _Batch) -> list[Row] | None:
        """Wait for work; the requests to start now, or None to exit (called holding the lock)."""
        while True:
            admit = bool(self._pending) and not self._held and (not batch.rows or batch.joinable)
            if admit or batch.rows:
                break
            if not self._cond.wait(WORKER_IDLE_EXIT_S) and not self._pending and not self._held:
                return None
        new: list[Row] = []
        while admit and self._pending and len(batch.rows) + len(new) < MAX_BATCH_ROWS:
            new.append(self._pending.popleft())
        return new

    def _run(self) -> None:
        batch = _Batch()
        while True:
            with self._cond:
                new = self._admit(batch)
                if new is None:
                    self._thread = None
                    return
            try:
                with torch.inference_mode():
                    for row in batch.rows:
                        if row.cancel.is_set():
                            row.close("cancelled")
                    self._compact(batch)
                    if new:
                        self._start(batch, new)
                    if batch.rows:
                        self._step(batch)
                        self._compact(batch)
            except BaseException as exc:  # e.g. out of memory: every request in flight gets the error
                for row in [*batch.rows, *new]:
                    row.fail(exc)
                batch = _Batch()
                if not isinstance(exc, Exception):
                    with self._cond:
                        self._thread = None
                    raise

    def _forward(self, **kwargs: Any) -> Any:
        if not self._position_ids:
            kwargs.pop("position_ids")
        return self.loaded.model(use_cache=True, **kwargs)

    def _start(self, batch: _Batch, new: list[Row]) -> None:
        """Prefill the new requests' prompts together, sample their first tokens, join the batch."""
        rows = []
        for row in new:
            if row.cancel.is_set():
                row.close("cancelled")
            else:
                rows.append(row)
        if not rows:
            return
        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row.prompt_ids)
            ids[i, width - n:] = torch.tensor(row.prompt_ids, dtype=torch.long)
            mask[i, width - n:] = 1
        device = self.loaded.device
        ids, mask = ids.to(device), mask.to(device)
        extra = {"logits_to_keep": 1} if self._logits_to_keep else {}
        out = self._forward(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                            **extra)
        self.stats.prefills += 1
        cache, nxt = out.past_key_values, self._sample(out.logits[:, -1, :], rows).view(-1, 1)
        keep = []
        for i, (row, token) in enumerate(zip(rows, nxt.view(-1).tolist())):
            row.take(token)
            if row.finish:
                row.close()
            else:
                keep.append(i)
        if not keep:
            return
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            rows, mask, nxt = [rows[i] for i in keep], mask[index], nxt[index]
        if not batch.rows:
            batch.rows, batch.cache, batch.mask, batch.nxt = rows, cache, mask, nxt
            batch.joinable = _joinable(cache)
            return
        # join the running batch: left-pad the shorter side so every row ends at the last column
        old_len, new_len = batch.mask.shape[1], mask.shape[1]
        length = max(old_len, new_len)
        for old, add in zip(batch.cache.layers, cache.layers):
            old.keys = torch.cat([_left_pad(old.keys, length - old_len), _left_pad(add.keys, length - new_len)])
            old.values = torch.cat([_left_pad(old.values, length - old_len), _left_pad(add.values, length - new_len)])
        batch.mask = torch.cat([_left_pad(batch.mask, length - old_len), _left_pad(mask, length - new_len)])
        batch.nxt = torch.cat([batch.nxt, nxt])
        batch.rows = batch.rows + rows

    def _step(self, batch: _Batch) -> None:
        """One token for every running row."""
        rows = batch.rows
        mask = torch.cat([batch.mask, batch.mask.new_ones((len(rows), 1))], dim=1)
        out = self._forward(input_ids=batch.nxt, attention_mask=mask, past_key_values=batch.cache,
                            position_ids=mask.sum(-1, keepdim=True) - 1)
        batch.mask, batch.cache = mask, out.past_key_values
        stats = self.stats
        stats.steps += 1
        stats.rows_stepped += len(rows)
        stats.max_rows = max(stats.max_rows, len(rows))
        batch.nxt = self._sample(out.logits[:, -1, :], rows).view(-1, 1)
        for row, token in zip(rows, batch.nxt.view(-1).tolist()):
            row.take(token)
            if row.finish:
                row.close()

    def _compact(self, batch: _Batch) -> None:
        """Drop finished rows from the batch, and cache positions no remaining row uses."""
        keep = [i for i, row in enumerate(batch.rows) if not row.finished.is_set()]
        if len(keep) == len(batch.rows):
            return
        if not keep:
            batch.rows, batch.cache, batch.mask, batch.nxt, batch.joinable = [], None, None, None, True
            return
        index = torch.tensor(keep, device=batch.mask.device)
        batch.cache.batch_select_indices(index)
        batch.rows = [batch.rows[i] for i in keep]
        batch.mask, batch.nxt = batch.mask[index], batch.nxt[index]
        unused = int(batch.mask.any(0).int().argmax())  # leading columns that are padding in every row
        if unused and batch.joinable:
            for layer in batch.cache.layers:
                layer.keys, layer.values = layer.keys[..., unused:, :], layer.values[..., unused:, :]
            batch.mask = batch.mask[:, unused:]

    def _sample(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        """Next token of every row, each with its own settings: the same warpers as
        ``model.generate`` (temperature, top-k, top-p) and multinomial sampling, or argmax. A row
        with a seed samples alone, from its own generator. A row's first token is never its end
        (EOS, end of turn), as ``min_new_tokens=1`` in ``model.generate``: an empty answer helps
        nobody, and the embedded model began 1 answer in 60 with its end."""
        scores = logits.float()
        for i, row in enumerate(rows):
            if not row.ids and row.ends:
                scores[i, [t for t in row.ends if t < scores.shape[-1]]] = float("-inf")
        groups: dict[tuple, list[int]] = {}
        for i, row in enumerate(rows):
            s = row.settings
            key = (True, s.temperature, s.top_p) if s.do_sample else (False,)
            groups.setdefault(key + (i,) if s.do_sample and s.seed is not None else key, []).append(i)
        if len(groups) == 1:
            key, members = next(iter(groups.items()))
            return self._pick(key, scores, self._generator(rows[members[0]], key))
        tokens = torch.empty(len(rows), dtype=torch.long, device=scores.device)
        for key, members in groups.items():
            index = torch.tensor(members, device=scores.device)
            tokens[index] = self._pick(key, scores[index], self._generator(rows[members[0]], key))
        return tokens

    def _generator(self, row: Row, key: tuple) -> torch.Generator | None:
        if len(key) < 4:  # greedy, or sampled without a seed
            return None
        if row.generator is None:
            row.generator = torch.Generator(device=self.loaded.device).manual_seed(int(row.settings.seed) % 2**64)
        return row.generator

    def _pick(self, key: tuple, scores: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if not key[0]:
            return scores.argmax(-1)
        warpers = self._warpers.get(key[:3])
        if warpers is None:
            _, temperature, top_p = key[:3]
            warpers = self._warpers[key[:3]] = [w for w in (
                TemperatureLogitsWarper(temperature) if temperature != 1.0 else None,
                TopKLogitsWarper(top_k=self._top_k) if self._top_k else None,
                TopPLogitsWarper(top_p=top_p) if top_p < 1.0 else None) if w is not None]
        for warp in warpers:
            scores = warp(None, scores)
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1, generator=generator).squeeze(1)


_WORKERS_LOCK = threading.Lock()


def worker_of(model: Any, key: str, make: Callable[[Any], Any]) -> Any:
    """``model``'s worker stored under ``key``, made by ``make(model)`` on first use (once, also when
    several threads ask at the same time)."""
    found = model.__dict__.get(key)
    if found is None:
        with _WORKERS_LOCK:
            found = model.__dict__.get(key)
            if found is None:
                found = model.__dict__[key] = make(model)
    return found


def batcher_for(loaded: LoadedModel) -> _Batcher:
    """The generation worker of ``loaded`` (one per loaded model, created on first use)."""
    return worker_of(loaded, "_batcher", _Batcher)


def batch_stats(loaded: LoadedModel) -> BatchStats:
    return batcher_for(loaded).stats
