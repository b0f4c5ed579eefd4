"""Conversations, messages (streamed answers), regenerate, edit-and-resend, feedback and side-by-side compare.

Callers only ever see their own conversations: anything else is a 404, exactly as if it did
not exist. Generation happens before anything is written where possible, and a failed
generation removes what the request wrote, so no half-finished exchange is ever stored.
"""
from __future__ import annotations

import json
import random
import re
from typing import Any, Iterator

from flask import Blueprint, Response, current_app, jsonify, session, stream_with_context
from flask_login import current_user
from sqlalchemy.exc import IntegrityError
from werkzeug.exceptions import BadRequest, NotFound, ServiceUnavailable

from rlhf.generation import GenerationResult, LoadedModel, generate_chat, generate_chats, stream_chat

from ..auth import current_visitor
from ..database import group_commit_writer
from ..extensions import db
from ..models import Comparison, Conversation, Feedback, Message, User, iso, utcnow
from ..security import chat_limit, feedback_limit
from ..serving import Route, generation_settings, route_for, serve
from ..validation import (MAX_TITLE_CHARS, bool_field, feedback_changes, json_body, message_content, optional_id,
                          text_field)

bp = Blueprint("chat_api", __name__, url_prefix="/api")


# ---------------------------------------------------------------------------- serialisation

def feedback_dict(fb: Feedback | None) -> dict[str, Any] | None:
    if fb is None:
        return None
    return {"thumb": fb.thumb, "rating": fb.rating, "correction": fb.correction, "comment": fb.comment,
            "reasons": fb.reasons or [], "updated_at": iso(fb.updated_at)}


def message_dict(m: Message, fb: Feedback | None = None) -> dict[str, Any]:
    return {"id": m.id, "role": m.role, "content": m.content, "parent_id": m.parent_id,
            "model_version": m.model_version.name if m.model_version else None, "arm": m.arm,
            "latency_ms": round(m.latency_ms, 1) if m.latency_ms is not None else None,
            "token_count": m.token_count, "created_at": iso(m.created_at),
            "feedback": feedback_dict(fb) if m.role == "assistant" else None}


def comparison_dict(c: Comparison) -> dict[str, Any]:
    return {"id": c.id, "prompt_message_id": c.prompt_message_id, "a": c.message_a_id, "b": c.message_b_id,
            "winner": c.winner}


def conversation_summary(c: Conversation) -> dict[str, Any]:
    return {"id": c.id, "title": c.title, "created_at": iso(c.created_at), "updated_at": iso(c.updated_at)}


# ---------------------------------------------------------------------------- ownership

def own_conversation(conversation_id: int, user: User) -> Conversation:
    conv = db.session.get(Conversation, conversation_id)
    if conv is None or conv.user_id != user.id or conv.deleted_at is not None:
        raise NotFound("Conversation not found.")
    return conv


# Built once: the feedback path runs these on every request (building a statement costs more than
# running it on SQLite). One query each: the message joined to its live conversation of the caller.
_OWN_MESSAGE = (db.select(Message).join(Conversation, Message.conversation_id == Conversation.id)
                .where(Message.id == db.bindparam("message_id"), Conversation.user_id == db.bindparam("user_id"),
                       Conversation.deleted_at.is_(None)))
_c, _m, _u = Conversation.__table__.c, Message.__table__.c, User.__table__.c  # Core: no ORM result processing
_OWN_ANSWER = (db.select(_c.user_id).select_from(Conversation.__table__)
               .join(Message.__table__, _m.conversation_id == _c.id).join(User.__table__, _u.id == _c.user_id)
               .where(_m.id == db.bindparam("message_id"), _m.role == "assistant",
                      _u.anon_id == db.bindparam("anon_id"), _c.deleted_at.is_(None)))
_FEEDBACK_ROW = db.select(Feedback).where(Feedback.user_id == db.bindparam("user_id"),
                                          Feedback.message_id == db.bindparam("message_id"))


def own_message(message_id: int, user: User) -> Message:
    msg = db.session.scalars(_OWN_MESSAGE, {"message_id": message_id, "user_id": user.id}).first()
    if msg is None:
        raise NotFound("Message not found.")
    return msg


def _own_answer_of_visitor(message_id: int) -> int | None:
    """The caller's user id when an anonymous visitor with a session names one of their own
    answers -- one query instead of the visitor, message and conversation lookups. None
    otherwise; the caller then takes the general path (``current_visitor`` + ``own_message``),
    which gives the same answer and reports errors."""
    anon_id = session.get("anon_id")
    if not anon_id or current_user.is_authenticated:
        return None
    # on the session's connection: Core execution, without the ORM layer (~0.1 ms less per rating)
    return db.session.connection().scalar(_OWN_ANSWER, {"message_id": message_id, "anon_id": anon_id})


def history(message: Message) -> list[dict[str, str]]:
    """The conversation up to and including ``message``, following parent links."""
    chain: list[Message] = []
    node: Message | None = message
    while node is not None:
        chain.append(node)
        node = db.session.get(Message, node.parent_id) if node.parent_id else None
    return [{"role": m.role, "content": m.content} for m in reversed(chain)]


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


# ---------------------------------------------------------------------------- conversations

@bp.post("/conversations")
def create_conversation():
    data = json_body({"title"}, required=False)
    user = current_visitor()
    title = text_field(data, "title", MAX_TITLE_CHARS, required=False) or "New chat"
    conv = Conversation(user_id=user.id, title=title)
    db.session.add(conv)
    db.session.commit()
    return jsonify(conversation_summary(conv)), 201


@bp.get("/conversations")
def list_conversations():
    user = current_visitor()
    convs = db.session.scalars(db.select(Conversation).filter_by(user_id=user.id, deleted_at=None)
                               .order_by(Conversation.updated_at.desc(), Conversation.id.desc())).all()
    return jsonify(conversations=[conversation_summary(c) for c in convs])


@bp.get("/conversations/<int:conversation_id>")
def get_conversation(conversation_id: int):
    user = current_visitor()
    conv = own_conversation(conversation_id, user)
    messages = list(conv.messages)
    ids = [m.id for m in messages]
    feedback = {f.message_id: f for f in db.session.scalars(
        db.select(Feedback).filter(Feedback.user_id == user.id, Feedback.message_id.in_(ids)))} if ids else {}
    comparisons = db.session.scalars(db.select(Comparison).filter(Comparison.prompt_message_id.in_(ids))
                                     .order_by(Comparison.id)).all() if ids else []
    return jsonify(**conversation_summary(conv), messages=[message_dict(m, feedback.get(m.id)) for m in messages],
                   comparisons=[comparison_dict(c) for c in comparisons])


@bp.patch("/conversations/<int:conversation_id>")
def rename_conversation(conversation_id: int):
    data = json_body({"title"})
    conv = own_conversation(conversation_id, current_visitor())
    conv.title = text_field(data, "title", MAX_TITLE_CHARS)  # type: ignore[assignment]
    db.session.commit()
    return jsonify(conversation_summary(conv))


@bp.delete("/conversations/<int:conversation_id>")
def delete_conversation(conversation_id: int):
    conv = own_conversation(conversation_id, current_visitor())
    conv.deleted_at = utcnow()  # hidden at once; excluded from training data and exports
    db.session.commit()
    return jsonify(id=conv.id, deleted=True)


# ---------------------------------------------------------------------------- answering

def _save_answer(user_msg_id: int, route: Route, result: GenerationResult) -> Message:
    """Store an answer. Takes ids, not ORM objects: a streamed response outlives the request's
    database session, so everything is looked up again here."""
    user_msg = db.session.get(Message, user_msg_id)
    answer = Message(conversation_id=user_msg.conversation_id, role="assistant", content=result.text,
                     parent_id=user_msg.id, model_version_id=route.version_id, experiment_id=route.experiment_id,
                     arm=route.arm, latency_ms=result.latency_ms, token_count=result.token_count)
    db.session.add(answer)
    user_msg.conversation.updated_at = utcnow()
    db.session.commit()
    return answer


def _sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def _answer(user_msg: Message, route: Route, loaded: LoadedModel, stream: bool, created_user_msg: bool):
    """Generate an answer to ``user_msg`` as an SSE stream or one JSON response.

    ``created_user_msg``: this request wrote ``user_msg``; it is removed again if no answer
    comes out, so the conversation never keeps a question the model never saw through.
    """
    messages = history(user_msg)
    settings = generation_settings()
    user_msg_id = user_msg.id
    # An answer takes a while: end the read transaction so that no database connection (nor, on
    # SQLite, a read snapshot that holds back WAL checkpoints) is held while it is generated.
    db.session.commit()

    def discard_question() -> None:
        db.session.rollback()
        if created_user_msg:
            db.session.delete(db.session.get(Message, user_msg_id))
            db.session.commit()

    if not stream:
        try:
            result = generate_chat(loaded, messages, settings)
        except Exception as exc:
            current_app.logger.exception("generation failed")
            discard_question()
            raise ServiceUnavailable(f"The model failed to answer ({type(exc).__name__}); please try again.") from exc
        answer = _save_answer(user_msg_id, route, result)
        return jsonify(user_message=message_dict(db.session.get(Message, user_msg_id)),
                       assistant_message=message_dict(answer)), 201

    handle = stream_chat(loaded, messages, settings)

    def events() -> Iterator[str]:
        finished = False
        try:
            for chunk in handle.chunks:
                yield _sse("token", {"text": chunk})
            finished = True
        except Exception as exc:  # generation failed: report it in the stream, keep nothing
            current_app.logger.exception("generation failed")
            discard_question()
            yield _sse("error", {"error": f"Generation failed: {type(exc).__name__}"})
            return
        finally:
            if not finished:
                handle.chunks.close()  # stops the generating thread; sets the partial result
            if not finished and handle.result is not None:
                # The client stopped the answer (or went away): keep what was said, if anything.
                if handle.result.text:
                    _save_answer(user_msg_id, route, handle.result)
                else:
                    discard_question()
        result = handle.result
        assert result is not None
        answer = _save_answer(user_msg_id, route, result)
        yield _sse("done", {"user_message_id": user_msg_id, "message_id": answer.id,
                            "model_version": route.version_name, "arm": route.arm,
                            "finish_reason": result.finish_reason, "token_count": result.token_count,
                            "latency_ms": round(result.latency_ms, 1), "content": answer.content})

    return Response(stream_with_context(events()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


TITLE_CHARS = 50  # a title made from the first question is cut (at a word) to about this many characters
_MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # [text](url) and ![alt](src): keep the text
_MD_LINE_START = re.compile(r"^(?:\s{0,3}(?:#{1,6}|>|[-*+]|\d{1,9}[.)])\s+)+")  # heading, quote, list marker
# paired marks only (as markdown renders them): `code`, **strong**, ~~struck~~, __strong__, *em*, _em_;
# underscores only at word boundaries (snake_case and __init__-like names inside words stay)
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


def _add_question(conv: Conversation, content: str, parent: Message | None) -> Message:
    """Store a user turn; the first one also titles the conversation."""
    user_msg = Message(conversation_id=conv.id, role="user", content=content, parent_id=parent.id if parent else None)
    db.session.add(user_msg)
    if conv.title == "New chat":
        conv.title = clean_title(content)
    db.session.commit()
    return user_msg


@bp.post("/conversations/<int:conversation_id>/messages")
@chat_limit
def post_message(conversation_id: int):
    data = json_body({"content", "stream", "parent_id"})
    user = current_visitor()
    conv = own_conversation(conversation_id, user)
    content = message_content(data)
    stream = bool_field(data, "stream", True)
    parent = resolve_parent(conv, data)
    # the version that really answers (a fallback when the routed one cannot be loaded); a model
    # that cannot answer at all fails with 503 before anything is written
    route, loaded = serve(route_for(user))
    user_msg = _add_question(conv, content, parent)
    return _answer(user_msg, route, loaded, stream, created_user_msg=True)


@bp.post("/messages/<int:message_id>/regenerate")
@chat_limit
def regenerate(message_id: int):
    data = json_body({"stream"}, required=False)
    user = current_visitor()
    msg = own_message(message_id, user)
    stream = bool_field(data, "stream", True)
    if msg.role == "assistant":
        msg = db.session.get(Message, msg.parent_id) if msg.parent_id else None
        if msg is None:
            raise BadRequest("This answer has no question to answer again.")
    elif msg.role != "user":
        raise BadRequest("Only answers (or the questions they answer) can be regenerated.")
    route, loaded = serve(route_for(user))
    return _answer(msg, route, loaded, stream, created_user_msg=False)


@bp.post("/messages/<int:message_id>/edit")
@chat_limit
def edit_message(message_id: int):
    """Edit and resend a question: a new user message beside the original (same parent, so
    the two are sibling branches the client pages between) and a fresh answer to it. The
    original, its answers and everything that followed them stay as they were."""
    data = json_body({"content", "stream"})
    user = current_visitor()
    original = own_message(message_id, user)
    if original.role != "user":
        raise BadRequest("Only your questions can be edited ('message_id' must be a user message).")
    content = message_content(data)
    stream = bool_field(data, "stream", True)
    parent = db.session.get(Message, original.parent_id) if original.parent_id else None
    route, loaded = serve(route_for(user))  # a model that cannot answer fails (503) before anything is written
    user_msg = _add_question(original.conversation, content, parent)
    return _answer(user_msg, route, loaded, stream, created_user_msg=True)


# ---------------------------------------------------------------------------- feedback

_UPSERTS: dict[tuple[str, tuple[str, ...]], Any] = {}
_RETURNED = ("thumb", "rating", "correction", "comment", "reasons", "updated_at")


def _upsert_feedback(user_id: int, message_id: int, changes: dict[str, Any]) -> dict[str, Any] | None:
    """Apply ``changes`` to the caller's feedback row on a message, creating it if needed, in one
    ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` statement (SQLite, PostgreSQL): atomic
    against a simultaneous first rating of the same answer, and a fraction of the ORM's cost.
    Returns the stored feedback as :func:`feedback_dict`, or None on other databases."""
    dialect = db.session.get_bind().dialect.name
    if dialect not in ("sqlite", "postgresql"):
        return None
    keys = tuple(sorted(changes))
    stmt = _UPSERTS.get((dialect, keys))
    if stmt is None:  # one statement per dialect and set of changed fields, built once
        if dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        columns = ("user_id", "message_id", "reasons", "created_at", "updated_at", *keys)
        table = Feedback.__table__  # the Core table: an ORM entity here would take the slower ORM bulk path
        ins = insert(table).values({c: db.bindparam(f"v_{c}", type_=table.c[c].type)
                                       for c in dict.fromkeys(columns)})
        stmt = _UPSERTS[(dialect, keys)] = ins.on_conflict_do_update(
            index_elements=["user_id", "message_id"],
            set_={c: ins.excluded[c] for c in (*keys, "updated_at")}
        ).returning(*(table.c[c] for c in _RETURNED))
    now = utcnow()
    params = {"v_user_id": user_id, "v_message_id": message_id, "v_reasons": [], "v_created_at": now,
              "v_updated_at": now, **{f"v_{k}": v for k, v in changes.items()}}
    writer = group_commit_writer(current_app)
    if writer is not None:  # SQLite: one writer at a time, so queued ratings share a transaction
        row = writer.execute_one(stmt, params)
    else:
        row = db.session.execute(stmt, params).one()
        db.session.commit()
    fb = dict(zip(_RETURNED, row))
    return {"thumb": fb["thumb"], "rating": fb["rating"], "correction": fb["correction"], "comment": fb["comment"],
            "reasons": fb["reasons"] or [], "updated_at": iso(fb["updated_at"])}


@bp.post("/messages/<int:message_id>/feedback")
@feedback_limit
def post_feedback(message_id: int):
    data = json_body({"thumb", "rating", "correction", "comment", "reasons"})
    user_id = _own_answer_of_visitor(message_id)
    if user_id is None:  # not the common case: an admin, a new visitor, or an error (404/400) to report
        user = current_visitor()
        msg = own_message(message_id, user)
        if msg.role != "assistant":
            raise BadRequest("Feedback can only be given on assistant answers.")
        user_id = user.id
    changes = feedback_changes(data)
    body = _upsert_feedback(user_id, message_id, changes)
    if body is not None:
        return jsonify(feedback=body, message_id=message_id)
    for attempt in range(2):  # databases without INSERT ... ON CONFLICT: through the ORM
        fb = db.session.scalars(_FEEDBACK_ROW, {"user_id": user_id, "message_id": message_id}).first()
        if fb is None:
            fb = Feedback(user_id=user_id, message_id=message_id, reasons=[])
            db.session.add(fb)
        for key, value in changes.items():
            setattr(fb, key, value)
        fb.updated_at = utcnow()
        body = feedback_dict(fb)  # before the commit expires it (reading it after costs a query)
        try:
            db.session.commit()
            break
        except IntegrityError:
            # A simultaneous request of the same user inserted the row first (unique per user and
            # message): apply this request's changes to that row instead.
            db.session.rollback()
            if attempt:
                raise
    return jsonify(feedback=body, message_id=message_id)


# ---------------------------------------------------------------------------- compare

def _compare_routes(user: User) -> tuple[Route, Route]:
    """Two answerers: control vs variant while an experiment runs (in random order, so
    position bias cancels out), otherwise two samples from the user's own model."""
    from ..experiments import running_experiment

    exp = running_experiment()
    if exp is None:
        route = route_for(user)
        return route, route
    pair = [Route.of(exp.control_version, exp.id, "control"), Route.of(exp.variant_version, exp.id, "variant")]
    random.shuffle(pair)
    return pair[0], pair[1]


@bp.post("/conversations/<int:conversation_id>/compare")
@chat_limit
def compare(conversation_id: int):
    data = json_body({"content", "parent_id", "message_id"})
    user = current_visitor()
    conv = own_conversation(conversation_id, user)
    (route_a, model_a), (route_b, model_b) = (serve(route) for route in _compare_routes(user))
    created = False
    if "message_id" in data:  # compare two new answers to a question already asked
        user_msg = own_message(optional_id(data, "message_id") or 0, user)
        if user_msg.conversation_id != conv.id or user_msg.role != "user":
            raise BadRequest("'message_id' must be one of your questions in this conversation.")
    else:
        content = message_content(data)
        parent = resolve_parent(conv, data)
        user_msg = _add_question(conv, content, parent)
        created = True
    messages = history(user_msg)
    settings = generation_settings()
    user_msg_id = user_msg.id
    db.session.commit()  # end the read transaction: no database connection held while generating
    try:
        # both at once: one batch when both sides are the same model, two workers side by side otherwise
        result_a, result_b = generate_chats([(model_a, messages), (model_b, messages)], settings)
    except Exception as exc:
        current_app.logger.exception("generation failed")
        db.session.rollback()
        if created:
            db.session.delete(db.session.get(Message, user_msg_id))
            db.session.commit()
        raise ServiceUnavailable(f"The model failed to answer ({type(exc).__name__}); please try again.") from exc
    answer_a = _save_answer(user_msg.id, route_a, result_a)
    answer_b = _save_answer(user_msg.id, route_b, result_b)
    pair = Comparison(user_id=user.id, prompt_message_id=user_msg.id, message_a_id=answer_a.id,
                      message_b_id=answer_b.id)
    db.session.add(pair)
    db.session.commit()
    return jsonify(pair_id=pair.id, user_message=message_dict(user_msg), a=message_dict(answer_a),
                   b=message_dict(answer_b)), 201


@bp.post("/pairs/<int:pair_id>/vote")
@feedback_limit
def vote(pair_id: int):
    data = json_body({"winner"})
    user = current_visitor()
    pair = db.session.get(Comparison, pair_id)
    if pair is None or pair.user_id != user.id or db.session.get(Message, pair.prompt_message_id) \
            .conversation.deleted_at is not None:
        raise NotFound("Comparison not found.")
    winner = data.get("winner")
    if winner not in ("a", "b", "tie", "both_bad"):
        raise BadRequest("'winner' must be \"a\", \"b\", \"tie\" or \"both_bad\".")
    pair.winner = winner
    pair.voted_at = utcnow()
    db.session.commit()
    chosen = pair.message_b_id if winner == "b" else pair.message_a_id
    return jsonify(pair=comparison_dict(pair), continue_from=chosen)
