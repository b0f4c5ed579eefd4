"""Request validation with clear messages. Every failure is a 400 with ``{"error": ...}``. The
ratings' fields are checked by their kinds (webapp.core.ratings)."""
from __future__ import annotations

from typing import Any

from flask import current_app, request
from werkzeug.exceptions import BadRequest
from werkzeug.routing import IntegerConverter

MAX_TITLE_CHARS = 200
MAX_ID = 2**63 - 1  # the largest id a 64-bit database integer (SQLite INTEGER, BIGINT) can hold


class IdConverter(IntegerConverter):
    """``<int:...>`` in URLs: a number no database id can be (beyond 64 bits) does not match,
    so it is a plain 404 rather than an overflow inside the database driver."""

    def __init__(self, map, fixed_digits: int = 0, min: int | None = None, max: int | None = MAX_ID,
                 signed: bool = False) -> None:
        super().__init__(map, fixed_digits=fixed_digits, min=min, max=max, signed=signed)


def clip(text: str, limit: int = 60) -> str:
    """User input quoted in an error message, cut short so that the message stays readable."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def json_body(allowed: set[str] | None = None, required: bool = True) -> dict[str, Any]:
    """The request's JSON object; rejects non-objects and (when ``allowed``) unknown keys."""
    try:
        data = request.get_json(silent=True)
    except RecursionError:  # JSON nested deeper than the parser can follow
        raise BadRequest("Request body is nested too deeply to be a JSON object the API accepts.") from None
    if data is None:
        if not required and not request.get_data():
            return {}
        raise BadRequest("Request body must be a JSON object (Content-Type: application/json).")
    if not isinstance(data, dict):
        raise BadRequest("Request body must be a JSON object.")
    if allowed is not None:
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise BadRequest(f"Unknown field(s): {', '.join(clip(k) for k in unknown[:10])}. "
                             f"Allowed: {', '.join(sorted(allowed))}.")
    return data


def text_field(data: dict, key: str, max_chars: int, required: bool = True, nullable: bool = False) -> str | None:
    """A non-empty string (after trimming) of at most ``max_chars`` characters."""
    value = data.get(key)
    if value is None:
        if key in data and nullable:
            return None
        if required:
            raise BadRequest(f"'{key}' is required.")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"'{key}' must be a string.")
    if "\x00" in value:
        raise BadRequest(f"'{key}' must not contain NUL characters.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON): no database can store it
        raise BadRequest(f"'{key}' must be valid Unicode text (it contains an unpaired surrogate).") from None
    value = value.strip()
    if not value:
        if nullable:
            return None  # an emptied field clears the value
        raise BadRequest(f"'{key}' must not be empty.")
    if len(value) > max_chars:
        raise BadRequest(f"'{key}' is too long ({len(value)} characters; the limit is {max_chars}).")
    return value


def message_content(data: dict) -> str:
    return text_field(data, "content", int(current_app.config["RLHF_MAX_MESSAGE_CHARS"]))  # type: ignore[return-value]


def bool_field(data: dict, key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be true or false.")
    return value


def optional_id(data: dict, key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ID:
        raise BadRequest(f"'{key}' must be a positive integer id.")
    return value
