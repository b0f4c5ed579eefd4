"""Answering a chat completion: generation through the app's model pool and batching worker, the
output rail, the stored conversation turn, and OpenAI's response shapes (``chat.completion``, or
``chat.completion.chunk`` events ending with ``data: [DONE]``).

The rail applies as on the chat page: streamed text is released only once no rule can still match
it. A stream cannot take back what it sent, so a streamed answer blocked after some of it went out
ends there (``finish_reason: "content_filter"``); one blocked before anything went out is
regenerated or refused as the rail's settings say, the refusal sent as its text. What is stored is
exactly what the client was sent. A client that goes away mid-stream stops the generation; what it
was sent is kept, as on the chat page. Nothing names the version or arm that answered.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator

from flask import current_app

from rlhf.generation import (
    GenerationResult,
    GenerationSettings,
    InferenceServerError,
    LoadedModel,
    fit_to_context,
    stream_prompt,
)
from rlhf.safety import Rail, RailedStream, railed_result
from webapp.core.extensions import db
from webapp.openai_api.errors import ApiError, error_body
from webapp.openai_api.keys import record_use
from webapp.openai_api.threads import store_completion
from webapp.serving.routing import Route

FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "length": "length", "cancelled": "stop",
                  "rail": "content_filter"}


@dataclass(frozen=True)
class Job:
    """One completion as plain values (a streamed answer outlives the request's database session)."""

    completion_id: str
    created: int
    model: str  # the public name the client asked for
    messages: tuple[dict[str, str], ...]
    settings: GenerationSettings
    stops: tuple[str, ...]
    user_id: int
    key_id: int
    chat_id: str | None
    external_message_id: str | None
    include_usage: bool
    frontend_task: bool = False  # a front end's own request (a chat title, tags...): not stored
    user_message_id: str | None = None  # the front end's id of the question (X-OpenWebUI-User-Message-Id)

    @property
    def continues(self) -> bool:
        """The last message is an answer so far: the reply continues it (webapp.openai_api.threads)."""
        return self.messages[-1]["role"] == "assistant"

    def said(self, sent: str) -> str:
        """The text of a reply as stored and returned: trimmed, but a continuation keeps its leading space."""
        return sent.rstrip() if self.continues else sent.strip()


def _store(job: Job, route: Route, result: GenerationResult, blocks=()) -> None:
    if job.frontend_task:  # answered, never stored (webapp.openai_api.frontend_tasks): only the key's use counts
        record_use(job.key_id)
        db.session.commit()
        return
    store_completion(user_id=job.user_id, key_id=job.key_id, messages=job.messages, chat_id=job.chat_id,
                     external_message_id=job.external_message_id, completion_id=job.completion_id, route=route,
                     result=result, blocks=blocks, user_message_id=job.user_message_id)


def _usage(prompt_tokens: int, result: GenerationResult) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": result.token_count,
            "total_tokens": prompt_tokens + result.token_count}


def _whole(loaded: LoadedModel, prompt: list[int], job: Job) -> GenerationResult:
    handle = stream_prompt(loaded, prompt, job.settings, extra_stops=job.stops, continues=job.continues)
    try:
        for _ in handle.chunks:
            pass
    except BaseException:
        handle.chunks.close()
        raise
    assert handle.result is not None
    return handle.result


def answer(job: Job, route: Route, loaded: LoadedModel, rail: Rail | None) -> dict[str, Any]:
    """A whole answer as a ``chat.completion`` object (stored before it is returned)."""
    prompt = fit_to_context(loaded, list(job.messages), job.settings.max_new_tokens)
    db.session.commit()  # no read transaction (nor database connection) held while generating
    try:
        outcome = railed_result(rail, job.messages, _whole(loaded, prompt, job), lambda: _whole(loaded, prompt, job))
    except Exception as exc:
        current_app.logger.exception("generation failed")
        raise ApiError(503, f"The model failed to answer ({type(exc).__name__}); please try again.") from exc
    result = outcome.result
    _store(job, route, result, outcome.blocks)
    return {"id": job.completion_id, "object": "chat.completion", "created": job.created, "model": job.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.text, "refusal": None},
                         "logprobs": None, "finish_reason": FINISH_REASONS.get(result.finish_reason, "stop")}],
            "usage": _usage(len(prompt), result), "system_fingerprint": None}


def _event(data: Any) -> str:
    return f"data: {json.dumps(data)}\n\n"


def stream(job: Job, route: Route, loaded: LoadedModel, rail: Rail | None) -> Iterator[str]:
    """A streamed answer: ``chat.completion.chunk`` events (the first with the role), a last one
    with the finish reason, the usage chunk when asked for, then ``data: [DONE]``."""
    prompt = fit_to_context(loaded, list(job.messages), job.settings.max_new_tokens)
    db.session.commit()
    usage_field = {"usage": None} if job.include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _event({"id": job.completion_id, "object": "chat.completion.chunk", "created": job.created,
                       "model": job.model, "system_fingerprint": None,
                       "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                       **usage_field})

    guarded = RailedStream(rail, job.messages, lambda: stream_prompt(loaded, prompt, job.settings,
                                                                      extra_stops=job.stops, continues=job.continues),
                            can_retract=False)
    sent: list[str] = []

    def events() -> Iterator[str]:
        finished = False
        try:
            yield chunk({"role": "assistant", "content": ""})
            for kind, data in guarded:
                if kind == "token":
                    sent.append(data["text"])
                    yield chunk({"content": data["text"]})
                elif data["action"] == "refused" and not sent:  # nothing went out yet: the refusal is the answer
                    sent.append(data["text"])
                    yield chunk({"content": data["text"]})
            finished = True
        except Exception as exc:  # generation failed: say so in OpenAI's shape, store nothing
            current_app.logger.exception("generation failed")
            db.session.rollback()
            where = " (the model server did not answer)" if isinstance(exc, InferenceServerError) else ""
            yield _event(error_body(503, f"Generation failed: {type(exc).__name__}{where}"))
            yield "data: [DONE]\n\n"
            return
        finally:
            if not finished:
                guarded.close()  # stops the generation
            if not finished and guarded.stopped and guarded.outcome is not None and "".join(sent).strip():
                outcome = guarded.outcome  # the client went away: keep what it was sent
                _store(job, route, replace(outcome.result, text=job.said("".join(sent))), outcome.blocks)
        outcome = guarded.outcome
        assert outcome is not None
        result = replace(outcome.result, text=job.said("".join(sent)))
        _store(job, route, result, outcome.blocks)
        yield chunk({}, FINISH_REASONS.get(result.finish_reason, "stop"))
        if job.include_usage:
            yield _event({"id": job.completion_id, "object": "chat.completion.chunk", "created": job.created,
                          "model": job.model, "system_fingerprint": None, "choices": [],
                          "usage": _usage(len(prompt), result)})
        yield "data: [DONE]\n\n"

    return events()


def new_job(**values: Any) -> Job:
    return Job(created=int(time.time()), **values)
