"""Open WebUI's feedback export, read and checked: each record -> a rating to store, or why not.

Open WebUI's admin export (``GET /api/v1/evaluations/feedbacks/all/export``) is a JSON list of
feedback records: ``{id, user_id, type: "rating", data: {rating: 1|-1, details: {rating: 1-10},
reason, comment, model_id, sibling_model_ids}, meta: {chat_id, message_id, arena}, snapshot: {chat},
created_at, updated_at}``, where ``snapshot.chat`` is the whole chat as Open WebUI stored it
(``chat.history.messages``: id -> ``{id, parentId, childrenIds, role, content, model}``).

A record's values as this app's feedback: ``data.rating`` 1/-1 -> thumb up/down, ``details.rating``
1-10 -> stars ``ceil(r / 2)``, ``reason`` -> a reason chip where one means the same
(:data:`REASON_CHIPS`), else "Reason: ..." appended to ``comment``. From the snapshot: the rated
answer's text, its question's and the question's other answers (siblings), which
webapp.training.openwebui matches to stored answers.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from werkzeug.exceptions import BadRequest

from webapp.core.ratings.comment import MAX_COMMENT_CHARS
from webapp.core.ratings.registry import feedback_changes
from webapp.core.validation import clip

EXPORT_PATH = "/api/v1/evaluations/feedbacks/all/export"
# How far ahead of this server's clock a record's time may be (two servers' clocks differ a little).
FUTURE_SKEW = timedelta(minutes=5)

# Open WebUI's reason keys (older versions stored the English label, normalized to the same key)
# -> this app's reason chips. Others are kept as text in the comment.
REASON_CHIPS = {"accurate_information": "accurate", "positive_attitude": "polite", "too_verbose": "too long",
                "not_helpful": "unhelpful", "not_factually_correct": "wrong"}
REASON_LABELS = {"accurate_information": "Accurate information",
                 "followed_instructions_perfectly": "Followed instructions perfectly",
                 "showcased_creativity": "Showcased creativity", "positive_attitude": "Positive attitude",
                 "attention_to_detail": "Attention to detail", "thorough_explanation": "Thorough explanation",
                 "dont_like_the_style": "Don't like the style", "too_verbose": "Too verbose",
                 "not_helpful": "Not helpful", "not_factually_correct": "Not factually correct",
                 "didnt_fully_follow_instructions": "Didn't fully follow instructions",
                 "refused_when_it_shouldnt_have": "Refused when it shouldn't have", "being_lazy": "Being lazy",
                 "other": "Other"}


class ExportError(ValueError):
    """The file or response as a whole is not an Open WebUI feedback export (one line)."""


class Unmatched(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def load_export(raw: str | bytes) -> list:
    """The export's records; ExportError when it is not JSON or not a list."""
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise ExportError("not JSON: the bytes are not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:
        raise ExportError(f"not JSON ({exc})" if isinstance(exc, ValueError) else "not JSON (nested too deeply)") \
            from None
    if not isinstance(data, list):
        raise ExportError(f"not an Open WebUI feedback export: expected a JSON list of feedback records, "
                          f"got a JSON {type(data).__name__}")
    return data


@dataclass
class Snap:
    """A message of the record's chat snapshot."""

    id: str
    content: str | None


@dataclass
class Rating:
    index: int
    id: str
    at: datetime  # the record's updated_at (naive UTC)
    user_id: str | None
    chat_id: str | None
    message_id: str
    thumb: str
    changes: dict[str, Any]
    answer: Snap | None = None
    question: Snap | None = None
    siblings: list[Snap] = field(default_factory=list)
    sibling_models: list[str] = field(default_factory=list)


def epoch(value: Any) -> datetime | None:
    """Open WebUI's epoch seconds (or ms/us/ns) as naive UTC."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    seconds = float(value)
    while seconds > 1e11:  # milliseconds, microseconds, nanoseconds
        seconds /= 1000
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError):
        return None


def _reason_key(reason: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", reason.lower().replace("'", "").replace("\u2019", "")).strip("_")


def _text(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise Unmatched("malformed", f"{where} is not text")


def _snapshot(raw: Any, message_id: str) -> tuple[Snap | None, Snap | None, list[Snap]]:
    """The rated answer, its question and the question's other answers, from ``snapshot.chat``
    (Open WebUI's chat: ``chat.chat.history.messages``; a bare chat object also works)."""
    if raw is None:
        return None, None, []
    if not isinstance(raw, dict):
        raise Unmatched("malformed", "snapshot is not an object")
    chat = raw.get("chat")
    chat = chat.get("chat") if isinstance(chat, dict) and isinstance(chat.get("chat"), dict) else chat
    history = chat.get("history") if isinstance(chat, dict) else None
    messages = history.get("messages") if isinstance(history, dict) else None
    if not isinstance(messages, dict):
        return None, None, []

    def snap(mid: Any, role: str) -> Snap | None:
        m = messages.get(mid) if isinstance(mid, str) else None
        if not isinstance(m, dict) or m.get("role") != role:
            return None
        return Snap(mid, m["content"] if isinstance(m.get("content"), str) else None)

    answer = snap(message_id, "assistant")
    parent_id = messages[message_id].get("parentId") if answer else None
    parent = messages.get(parent_id) if isinstance(parent_id, str) else None
    question = snap(parent.get("id"), "user") if isinstance(parent, dict) else None
    kids = parent.get("childrenIds") if question and isinstance(parent.get("childrenIds"), list) else []
    siblings = [s for s in (snap(k, "assistant") for k in kids if k != message_id) if s is not None]
    return answer, question, siblings


def record_time(raw: dict, now: datetime | None = None) -> datetime | None:
    """A record's ``updated_at`` (else ``created_at``) as naive UTC; None when it is not a time or lies
    more than :data:`FUTURE_SKEW` ahead of ``now``: a time from the future would outrank every later
    rating of the answer's owner, on every import, until that time came."""
    at = epoch(raw.get("updated_at", raw.get("created_at")))
    if at is None or at > (now or datetime.now(timezone.utc).replace(tzinfo=None)) + FUTURE_SKEW:
        return None
    return at


def parse_rating(index: int, raw: Any, now: datetime | None = None) -> Rating:
    """One export record as a rating to store; raises Unmatched (malformed, not a rating)."""
    if not isinstance(raw, dict):
        raise Unmatched("malformed", "not a JSON object")
    fid = raw.get("id")
    if not isinstance(fid, str) or not fid:
        raise Unmatched("malformed", "no feedback id")
    kind = raw.get("type")
    if kind != "rating":
        if isinstance(kind, str):
            raise Unmatched("not a rating", f"type {clip(kind)!r}")
        raise Unmatched("malformed", "no type")
    data, meta = raw.get("data"), raw.get("meta")
    if not isinstance(data, dict):
        raise Unmatched("malformed", "data is not an object")
    if not isinstance(meta, dict):
        raise Unmatched("malformed", "meta is not an object")
    rating = data.get("rating")
    if isinstance(rating, str) and rating.strip() in ("1", "-1"):
        rating = int(rating)
    if isinstance(rating, bool) or rating not in (1, -1):
        raise Unmatched("malformed", f"data.rating must be 1 or -1 (got {clip(json.dumps(rating))})")
    message_id = meta.get("message_id")
    if not isinstance(message_id, str) or not message_id:
        raise Unmatched("malformed", "meta.message_id is missing")
    chat_id = _text(meta.get("chat_id"), "meta.chat_id") or None
    at = record_time(raw, now)
    if at is None:
        if epoch(raw.get("updated_at", raw.get("created_at"))) is not None:
            raise Unmatched("malformed", "updated_at is in the future")
        raise Unmatched("malformed", "updated_at is not a time")
    user = raw.get("user")
    user_id = raw.get("user_id") or (user.get("id") if isinstance(user, dict) else None)

    body: dict[str, Any] = {"thumb": "up" if rating == 1 else "down"}
    details = data.get("details")
    stars = details.get("rating") if isinstance(details, dict) else None
    if stars is not None:
        if isinstance(stars, bool) or not isinstance(stars, int) or not 1 <= stars <= 10:
            raise Unmatched("malformed", f"data.details.rating must be 1-10 (got {clip(json.dumps(stars))})")
        body["rating"] = (stars + 1) // 2  # 1-10 -> 1-5 stars: ceil(r / 2)
    reason, comment = _text(data.get("reason"), "data.reason"), _text(data.get("comment"), "data.comment")
    parts = [comment.strip()] if comment and comment.strip() else []
    key = _reason_key(reason) if reason else ""
    body["reasons"] = [REASON_CHIPS[key]] if key in REASON_CHIPS else []
    if key and key not in REASON_CHIPS:
        parts.append(f"Reason: {REASON_LABELS.get(key, reason.strip())}")
    body["comment"] = clip("\n".join(parts), MAX_COMMENT_CHARS) if parts else None
    try:
        changes = feedback_changes(body)  # the chat API's own checks (NUL characters, lengths)
    except BadRequest as exc:
        raise Unmatched("malformed", str(exc.description)) from None
    answer, question, siblings = _snapshot(raw.get("snapshot"), message_id)
    models = data.get("sibling_model_ids")
    return Rating(index, fid, at, user_id if isinstance(user_id, str) and user_id else None, chat_id, message_id,
                   body["thumb"], changes, answer, question, siblings,
                   [m for m in models if isinstance(m, str)] if isinstance(models, list) else [])
