"""Chat generation in three layers, each in its own module:

- ``pool``: loading and holding model versions (``ModelPool``, ``LoadedModel``), the settings and
  result of an answer, and fitting a conversation into the context window (``fit_to_context``).
- ``rows``: one request's answer, decoded incrementally and cut at stop strings (in-process and remote alike).
- ``batcher``: one worker thread per loaded model that generates every answer in flight as one
  batch, rows joining and leaving at step boundaries (``batcher_for``, ``batch_stats``).
- ``stream``: an answer as a stream of text chunks that owns its final ``GenerationResult``
  (``stream_chat`` -> ``StreamHandle``), and whole answers read through it (``generate_chat``,
  ``generate_chats``).
- ``remote``: the same interface on an OpenAI-compatible inference server such as vLLM
  (``RemotePool`` in place of ``ModelPool``; ``RemoteModel`` in place of ``LoadedModel``).
- ``openai_server``: an OpenAI-compatible server on this package's own in-process generation.

The public API is re-exported here. Tuning constants and private helpers live in the module that
uses them: patch them there (e.g. ``rlhf.generation.batcher.WORKER_IDLE_EXIT_S``), not here.
"""
from __future__ import annotations

from rlhf.generation.batcher import BatchStats, batch_stats, batcher_for
from rlhf.generation.pool import GenerationResult, GenerationSettings, LoadedModel, ModelPool, fit_to_context
from rlhf.generation.remote import InferenceServerError, InferenceServerUnavailable, RemoteModel, RemotePool
from rlhf.generation.stream import StreamHandle, generate_chat, generate_chats, stream_chat, stream_prompt

__all__ = [
    "BatchStats",
    "GenerationResult",
    "GenerationSettings",
    "InferenceServerError",
    "InferenceServerUnavailable",
    "LoadedModel",
    "ModelPool",
    "RemoteModel",
    "RemotePool",
    "StreamHandle",
    "batch_stats",
    "batcher_for",
    "fit_to_context",
    "generate_chat",
    "generate_chats",
    "stream_chat",
    "stream_prompt",
]
