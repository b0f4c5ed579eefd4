"""A chat completion request, checked: what OpenAI accepts that this app can honour, with a 400
in OpenAI's shape (naming the ``param``) for a wrong type or value. Fields this app does not use
(tools, logprobs, penalties, ...) are ignored, as OpenAI ignores what it does not know."""
from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from typing import Any

from flask import current_app, request

from webapp.openai_api.errors import ApiError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOPS = 4
MAX_STOP_CHARS = 200
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    messages: tuple[dict[str, str], ...]  # {"role": system/user/assistant, "content": text (trimmed)}
    stream: bool
    include_usage: bool
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    stop: tuple[str, ...]
    seed: int | None

    @property
    def continues(self) -> bool:
        """The last message is an answer of the assistant's to continue (the reply is its continuation)."""
        return self.messages[-1]["role"] == "assistant"


def json_object() -> dict[str, Any]:
    try:
        body = request.get_json(silent=True)
    except RecursionError:
        body = None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object (Content-Type: application/json).")
    return body


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise ApiError(400, f"'{name}' must be a number from {low:g} to {high:g}.", name)
    return float(value)


def _integer(body: dict, name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"'{name}' must be an integer from {low} to {high}.", name)
    return value


def _flag(value: Any, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false.", name)
    return value


def text_value(value: str, param: str) -> str:
    if "\x00" in value:
        raise ApiError(400, f"'{param}' must not contain NUL characters.", param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no database can store it
        raise ApiError(400, f"'{param}' must be valid Unicode text (it contains an unpaired surrogate).",
                       param) from None
    return value


def header_text(value: str | None, name: str) -> str | None:
    """A request header's value as the app reads it; 400 naming the header for a control character
    (gunicorn refuses most of them before the app sees the request, other servers and proxies may not)."""
    if value is not None and any(unicodedata.category(c) == "Cc" for c in value):
        raise ApiError(400, f"The {name} header must not contain control characters.", name, "invalid_header")
    return value


def _content(value: Any, param: str) -> str:
    """A message's text: a string, or a list of text parts (joined by newlines)."""
    if isinstance(value, str):
        return text_value(value, param)
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            where = f"{param}[{i}]"
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else None
                reason = (f"parts of type {kind!r} are not supported (text only)" if isinstance(kind, str)
                          else "each part must be an object {\"type\": \"text\", \"text\": \"...\"}")
                raise ApiError(400, f"'{where}': {reason}.", where)
            texts.append(text_value(part["text"], where))
        return "\n".join(texts)
    raise ApiError(400, f"'{param}' must be a string or a list of text parts.", param)


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects.", "messages")
    # Bounds of one request's work: every message of a new history is parsed, matched and stored.
    cfg = current_app.config
    most, history_limit = int(cfg["RLHF_API_MAX_MESSAGES"]), int(cfg["RLHF_API_MAX_HISTORY_CHARS"])
    if len(value) > most:
        raise ApiError(400, f"'messages' has {len(value)} messages; the limit is {most}. Send the recent history "
                            "only.", "messages", "array_above_max_length")
    limit = int(cfg["RLHF_MAX_MESSAGE_CHARS"])
    out, total = [], 0
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ApiError(400, f"'{where}' must be an object with 'role' and 'content'.", where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            shown = repr(role[:40]) if isinstance(role, str) else "missing or not a string"
            raise ApiError(400, f"'{where}.role' ({shown}) must be one of system, developer, user, assistant "
                                "(this model has no tools).", f"{where}.role")
        content = _content(message.get("content"), f"{where}.content").strip()
        if len(content) > limit:
            raise ApiError(400, f"'{where}.content' is too long ({len(content)} characters; the limit is {limit}).",
                           f"{where}.content")
        total += len(content)
        out.append({"role": ROLES[role], "content": content})
    if total > history_limit:
        raise ApiError(400, f"The messages hold {total} characters; the limit is {history_limit}. Send the recent "
                            "history only.", "messages", "context_length_exceeded")
    # The last message is the user's question, or an answer of the assistant's to continue (Open WebUI's
    # "Continue Response"; vLLM and llama.cpp continue a final assistant message the same way).
    if out[-1]["role"] not in ("user", "assistant") or not out[-1]["content"] \
            or not any(m["role"] == "user" for m in out):
        raise ApiError(400, "The last message must be the user's question (role 'user', not empty), or an answer of "
                            "the assistant's to continue (role 'assistant', not empty, after a user message).",
                       "messages")
    return tuple(out)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOPS} strings.", "stop")
    for stop in stops:
        if len(stop) > MAX_STOP_CHARS:
            raise ApiError(400, f"each 'stop' sequence must be at most {MAX_STOP_CHARS} characters.", "stop")
        text_value(stop, "stop")
    return tuple(dict.fromkeys(s for s in stops if s))


def completion_request(body: dict[str, Any]) -> CompletionRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "You must provide a model parameter (a string: see GET /v1/models).", "model")
    n = _integer(body, "n", 1, 128)
    if n not in (None, 1):
        raise ApiError(400, "'n' must be 1: this API returns one answer per request.", "n")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", "stream_options")
    include_usage = _flag((options or {}).get("include_usage"), "stream_options.include_usage")
    limit = _integer(body, "max_completion_tokens", 1, 2**31)
    if limit is None:
        limit = _integer(body, "max_tokens", 1, 2**31)
    return CompletionRequest(model=model, messages=_messages(body.get("messages")),
                             stream=_flag(body.get("stream"), "stream"), include_usage=include_usage,
                             max_tokens=limit, temperature=_number(body, "temperature", 0, 2),
                             top_p=_number(body, "top_p", 0, 1), stop=_stop(body.get("stop")),
                             seed=_integer(body, "seed", -MAX_SEED - 1, MAX_SEED))
