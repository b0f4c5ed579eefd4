"""Conversations and messages as their owner sees them: lookups that 404 on anyone else's,
where a new message attaches, titles, storing an answer, and the JSON shapes the chat API answers with.

Arms are blind: an answer's JSON names the model version and A/B arm that wrote it only to an
admin (:func:`sees_arms`), and never while the answer is one side of a compare nobody voted on
yet. End users never learn which arm or version answered them, so neither their ratings nor
their votes can lean on the name (as in Chatbot Arena, where identities stay hidden)."""
from __future__ import annotations

import re
from typing import Any, Sequence

from flask import session
from flask_login import current_user
from werkzeug.exceptions import BadRequest, NotFound

from rlhf.generation import GenerationResult
from rlhf.safety import Block
from webapp.core.extensions import db
from webapp.core.identity import is_admin
from webapp.core.models import Comparison, Conversation, Feedback, Flag, Message, User, iso, utcnow
from webapp.core.ratings.flag import flag_dict
from webapp.core.ratings.registry import feedback_dict
from webapp.core.validation import optional_id
from webapp.safety.rail import record_interventions
from webapp.serving.routing import Route


def sees_arms() -> bool:
    """Whether the caller may learn which model version and A/B arm answered: admins only."""
    return is_admin()


def message_dict(m: Message, fb: Feedback | None = None, reveal: bool = False,
                 flag: Flag | None = None) -> dict[str, Any]:
    """A message as the chat API shows it, with the caller's feedback and flag on an answer.
    ``reveal`` (an admin, see :func:`sees_arms`) adds ``model_version`` and ``arm``; without it
    nothing says which version or arm wrote it."""
    out = {"id": m.id, "role": m.role, "content": m.content, "parent_id": m.parent_id,
           "latency_ms": round(m.latency_ms, 1) if m.latency_ms is not None else None,
           "token_count": m.token_count, "created_at": iso(m.created_at),
           "cut": m.finish_reason == "length",  # stopped by the generation limit, not by the model
           "feedback": feedback_dict(fb) if m.role == "assistant" else None,
           "flag": flag_dict(flag) if m.role == "assistant" else None}
    if reveal:
        out["model_version"] = m.model_version.name if m.model_version else None
        out["arm"] = m.arm
    return out


def comparison_dict(c: Comparison) -> dict[str, Any]:
    return {"id": c.id, "prompt_message_id": c.prompt_message_id, "a": c.message_a_id, "b": c.message_b_id,
            "winner": c.winner}


def answerer_dict(m: Message | None) -> dict[str, Any]:
    """Which version and arm wrote an answer (admins only, after a vote)."""
    if m is None:
        return {"model_version": None, "arm": None}
    return {"model_version": m.model_version.name if m.model_version else None, "arm": m.arm}


def conversation_summary(c: Conversation) -> dict[str, Any]:
    return {"id": c.id, "title": c.title, "created_at": iso(c.created_at), "updated_at": iso(c.updated_at)}


def own_conversation(conversation_id: int, user: User) -> Conversation:
    conv = db.session.get(Conversation, conversation_id)
    if conv is None or conv.user_id != user.id or conv.deleted_at is not None:
        raise NotFound("Conversation not found.")
    return conv


_OWN_MESSAGE = (db.select(Message).join(Conversation, Message.conversation_id == Conversation.id)
                .where(Message.id == db.bindparam("message_id"), Conversation.user_id == db.bindparam("user_id"),
                       Conversation.deleted_at.is_(None)))


_c, _m, _u = Conversation.__table__.c, Message.__table__.c, User.__table__.c  # Core: no ORM result processing


_OWN_ANSWER = (db.select(_c.user_id).select_from(Conversation.__table__)
               .join(Message.__table__, _m.conversation_id == _c.id).join(User.__table__, _u.id == _c.user_id)
               .where(_m.id == db.bindparam("message_id"), _m.role == "assistant",
                      _u.anon_id == db.bindparam("anon_id"), _c.deleted_at.is_(None)))


def own_message(message_id: int, user: User) -> Message:
    msg = db.session.scalars(_OWN_MESSAGE, {"message_id": message_id, "user_id": user.id}).first()
    if msg is None:
        raise NotFound("Message not found.")
    return msg


def own_answer_of_visitor(message_id: int) -> int | None:
    """The caller's user id when an anonymous visitor with a session names one of their own
    answers -- one query instead of the visitor, message and conversation lookups. None
    otherwise; the caller then takes the general path (``current_visitor`` + ``own_message``),
    which gives the same answer and reports errors."""
    anon_id = session.get("anon_id")
    if not anon_id or current_user.is_authenticated:
        return None
    # on the session's connection: Core execution, without the ORM layer (~0.1 ms less per rating)
    return db.session.connection().scalar(_OWN_ANSWER, {"message_id": message_id, "anon_id": anon_id})


def default_parent(conv: Conversation) -> Message | None:
    """Where a new user message attaches when the client does not say: the newest answer that
    did not lose a side-by-side vote."""
    losers = set()
    for c in db.session.scalars(db.select(Comparison).join(Message, Comparison.prompt_message_id == Message.id)
                                .filter(Message.conversation_id == conv.id)):
        losers.add(c.message_a_id if c.winner == "b" else c.message_b_id)
    for m in db.session.scalars(db.select(Message).filter_by(conversation_id=conv.id, role="assistant")
                                .order_by(Message.id.desc())):
        if m.id not in losers:
            return m
    return None


def resolve_parent(conv: Conversation, data: dict) -> Message | None:
    if "parent_id" not in data:
        return default_parent(conv)
    parent_id = optional_id(data, "parent_id")
    if parent_id is None:
        return None
    parent = db.session.get(Message, parent_id)
    if parent is None or parent.conversation_id != conv.id:
        raise NotFound("Parent message not found in this conversation.")
    if parent.role != "assistant":
        raise BadRequest("'parent_id' must be an assistant message (the answer you are replying to).")
    return parent


TITLE_CHARS = 50  # a title made from the first question is cut (at a word) to about this many characters


_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # [text](url) and ![alt](src): keep the text


_MD_LINE_START = re.compile(r"^(?:\s{0,3}(?:#{1,6}|>|[-*+]|\d{1,9}[.)])\s+)+")  # heading, quote, list marker


_MD_CODE = re.compile(r"(`+)(.+?)\1")


_MD_PAIRS = (re.compile(r"(\*\*|~~)(?=\S)(.+?)(?<=\S)\1"), re.compile(r"(?<!\w)(__)(?=\S)(.+?)(?<=\S)\1(?!\w)"),
             re.compile(r"(?<!\w)([*_])(?=\S)(.+?)(?<=\S)\1(?!\w)"))


_TRAILING = ".,;:!?\u2026-\u2013\u2014*_~`#| "  # stripped from the end of a title


_LEADING = "*_~`# "  # markdown marks stripped from its start


def clean_title(text: str, limit: int = TITLE_CHARS) -> str:
    """A conversation title from its first question: markdown marks and fences dropped, whitespace
    collapsed, trailing punctuation stripped, cut at a word boundary near ``limit`` characters with
    an ellipsis. A question of punctuation or markup alone keeps its characters (collapsed, cut)."""
    lines = []
    for line in text.splitlines():
        if line.strip().startswith(("```", "~~~")):
            continue  # code fence lines; the code itself stays (it may be the whole question)
        lines.append(_MD_LINE_START.sub("", line))
    parts = _MD_CODE.split(_MD_LINK.sub(r"\1", " ".join(lines)))  # text, fence, code, text, fence, code, ...
    for i in range(0, len(parts), 3):
        for pattern in _MD_PAIRS:
            parts[i] = pattern.sub(r"\2", parts[i])
    title = "".join(part for i, part in enumerate(parts) if i % 3 != 1)
    title = " ".join(title.split()).rstrip(_TRAILING).lstrip(_LEADING)
    if not title:  # nothing but punctuation or markup, e.g. "???": keep it rather than no title
        title = " ".join(text.split())
    if len(title) <= limit:
        return title
    cut = title[:limit + 1]
    space = cut.rfind(" ")
    cut = cut[:space] if space >= limit // 2 else title[:limit]  # one very long word: cut inside it
    return (cut.rstrip(_TRAILING) or cut) + "\u2026"


def add_question(conv: Conversation, content: str, parent: Message | None) -> Message:
    """Store a user turn; the first one also titles the conversation."""
    user_msg = Message(conversation_id=conv.id, role="user", content=content, parent_id=parent.id if parent else None)
    db.session.add(user_msg)
    if conv.title == "New chat":
        conv.title = clean_title(content)
    db.session.commit()
    return user_msg


def store_answer(question: Message, route: Route, result: GenerationResult, blocks: Sequence[Block] = (),
                 **columns: Any) -> Message:
    """Store an answer to ``question`` (``result.text``: what the user saw), the rail's interventions
    on it and ``columns`` of the message (where it came from), and commit."""
    answer = Message(conversation_id=question.conversation_id, role="assistant", content=result.text,
                     parent_id=question.id, model_version_id=route.version_id, experiment_id=route.experiment_id,
                     arm=route.arm, latency_ms=result.latency_ms, token_count=result.token_count,
                     finish_reason=result.finish_reason, **columns)
    db.session.add(answer)
    question.conversation.updated_at = utcnow()
    if blocks:
        db.session.flush()
        record_interventions(blocks, message_id=answer.id, user_id=question.conversation.user_id,
                             conversation_id=question.conversation_id, version_id=route.version_id)
    db.session.commit()
    return answer
