"""Conversations, messages (streamed answers), regenerate, edit-and-resend, feedback and side-by-side compare.

Callers only ever see their own conversations: anything else is a 404, exactly as if it did
not exist. Generation happens before anything is written where possible, and a failed
generation removes what the request wrote, so no half-finished exchange is ever stored.

Arms are blind: no answer, stream event, compare or vote tells an end user which model version
or A/B arm answered. Admins see them, except on a compare until its vote is in (see
:func:`webapp.chat.conversations.sees_arms`).
"""
from __future__ import annotations

import json
import random
from typing import Iterator

from flask import Blueprint, Response, current_app, jsonify, stream_with_context
from werkzeug.exceptions import BadRequest, NotFound, ServiceUnavailable

from rlhf.generation import (
    GenerationResult,
    InferenceServerError,
    LoadedModel,
    generate_chat,
    generate_chats,
    stream_chat,
)
from rlhf.safety import Block, RailedStream, railed_result
from webapp.chat.conversations import (
    add_question,
    answerer_dict,
    comparison_dict,
    conversation_summary,
    message_dict,
    own_answer_of_visitor,
    own_conversation,
    own_message,
    resolve_parent,
    sees_arms,
    store_answer,
)
from webapp.core.extensions import db
from webapp.core.identity import current_visitor
from webapp.core.models import Comparison, Conversation, Feedback, Flag, Message, User, history, utcnow
from webapp.core.ratings.flag import FLAG_FIELDS, flag_fields
from webapp.core.ratings.registry import FEEDBACK_FIELDS, feedback_changes
from webapp.core.ratings.store import remove_flag, save_feedback, save_flag
from webapp.core.security import chat_limit, feedback_limit
from webapp.core.validation import MAX_TITLE_CHARS, bool_field, json_body, message_content, optional_id, text_field
from webapp.experiments.assignment import assign, running_experiment
from webapp.safety.rail import rail_for
from webapp.serving.routing import Route, generation_settings, route_for, serve

bp = Blueprint("chat_api", __name__, url_prefix="/api")


# ---------------------------------------------------------------------------- serialisation


# ---------------------------------------------------------------------------- ownership


# Built once: the feedback path runs these on every request (building a statement costs more than
# running it on SQLite). One query each: the message joined to its live conversation of the caller.


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
    flags = {f.message_id: f for f in db.session.scalars(
        db.select(Flag).filter(Flag.user_id == user.id, Flag.message_id.in_(ids)))} if ids else {}
    comparisons = db.session.scalars(db.select(Comparison).filter(Comparison.prompt_message_id.in_(ids))
                                     .order_by(Comparison.id)).all() if ids else []
    reveal = sees_arms()
    # the two sides of a compare nobody voted on yet stay "A" and "B", even to an admin
    undecided = {i for c in comparisons if c.winner is None for i in (c.message_a_id, c.message_b_id)}
    return jsonify(**conversation_summary(conv),
                   messages=[message_dict(m, feedback.get(m.id), reveal and m.id not in undecided, flags.get(m.id))
                             for m in messages],
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

def _save_answer(user_msg_id: int, route: Route, result: GenerationResult, blocks: list[Block] = ()) -> Message:
    """Store an answer and the rail's interventions on it. Takes ids, not ORM objects: a streamed
    response outlives the request's database session, so everything is looked up again here."""
    return store_answer(db.session.get(Message, user_msg_id), route, result, blocks)


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
    reveal = sees_arms()  # before generating: a streamed answer outlives the request
    rail = rail_for(route)  # the output rail (None when off): nothing unsafe is shown or stored
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
            outcome = railed_result(rail, messages, generate_chat(loaded, messages, settings),
                                   lambda: generate_chat(loaded, messages, settings))
        except Exception as exc:
            current_app.logger.exception("generation failed")
            discard_question()
            raise ServiceUnavailable(f"The model failed to answer ({type(exc).__name__}); please try again.") from exc
        answer = _save_answer(user_msg_id, route, outcome.result, outcome.blocks)
        return jsonify(user_message=message_dict(db.session.get(Message, user_msg_id), reveal=reveal),
                       assistant_message=message_dict(answer, reveal=reveal)), 201

    # the rail releases text only once it is safe, and replaces a blocked answer ("rail" event)
    guarded = RailedStream(rail, messages, lambda: stream_chat(loaded, messages, settings))

    def events() -> Iterator[str]:
        finished = False
        try:
            for kind, data in guarded:
                yield _sse(kind, data)
            finished = True
        except Exception as exc:  # generation failed: report it in the stream, keep nothing
            current_app.logger.exception("generation failed")
            discard_question()
            where = " (the model server did not answer)" if isinstance(exc, InferenceServerError) else ""
            yield _sse("error", {"error": f"Generation failed: {type(exc).__name__}{where}"})
            return
        finally:
            if not finished:
                guarded.close()  # stops the generating thread; the outcome keeps what was sent
            if not finished and guarded.stopped:
                # The client stopped the answer (or went away): keep what was said, if anything.
                if guarded.outcome is not None and guarded.outcome.result.text:
                    _save_answer(user_msg_id, route, guarded.outcome.result, guarded.outcome.blocks)
                else:
                    discard_question()
        outcome = guarded.outcome
        assert outcome is not None
        result = outcome.result
        answer = _save_answer(user_msg_id, route, result, outcome.blocks)
        done = {"user_message_id": user_msg_id, "message_id": answer.id, "finish_reason": result.finish_reason,
                "token_count": result.token_count, "latency_ms": round(result.latency_ms, 1),
                "content": answer.content}
        if reveal:
            done.update(model_version=route.version_name, arm=route.arm)
        yield _sse("done", done)

    return Response(stream_with_context(events()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# paired marks only (as markdown renders them): `code`, **strong**, ~~struck~~, __strong__, *em*, _em_;
# underscores only at word boundaries (snake_case and __init__-like names inside words stay)


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
    user_msg = add_question(conv, content, parent)
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
    user_msg = add_question(original.conversation, content, parent)
    return _answer(user_msg, route, loaded, stream, created_user_msg=True)


# ---------------------------------------------------------------------------- feedback


@bp.post("/messages/<int:message_id>/feedback")
@feedback_limit
def post_feedback(message_id: int):
    data = json_body(set(FEEDBACK_FIELDS))
    user_id = own_answer_of_visitor(message_id)
    if user_id is None:  # not the common case: an admin, a new visitor, or an error (404/400) to report
        user = current_visitor()
        msg = own_message(message_id, user)
        if msg.role != "assistant":
            raise BadRequest("Feedback can only be given on assistant answers.")
        user_id = user.id
    changes = feedback_changes(data)
    body = save_feedback(user_id, message_id, changes)
    return jsonify(feedback=body, message_id=message_id)


# ---------------------------------------------------------------------------- flags

def _own_answer(message_id: int) -> int:
    """The caller's user id when ``message_id`` is an answer in one of their live conversations;
    404 for anyone else's (as if it did not exist), 400 for one of their own questions."""
    user = current_visitor()
    msg = own_message(message_id, user)
    if msg.role != "assistant":
        raise BadRequest("Only assistant answers can be flagged ('message_id' is not an answer).")
    return user.id


@bp.post("/messages/<int:message_id>/flag")
@feedback_limit
def post_flag(message_id: int):
    """Flag an answer as harmful (``category`` of rlhf.data.criteria.FLAG_CATEGORIES, optional ``note``);
    flagging it again replaces the category and note."""
    data = json_body(set(FLAG_FIELDS))
    user_id = _own_answer(message_id)
    category, note = flag_fields(data)
    return jsonify(flag=save_flag(user_id, message_id, category, note), message_id=message_id)


@bp.delete("/messages/<int:message_id>/flag")
@feedback_limit
def delete_flag(message_id: int):
    """Remove the caller's flag from an answer (``removed``: whether there was one)."""
    user_id = _own_answer(message_id)
    return jsonify(flag=None, message_id=message_id, removed=remove_flag(user_id, message_id))


# ---------------------------------------------------------------------------- compare

def _compare_routes(user: User) -> tuple[Route, Route]:
    """Two answerers: control vs variant while an experiment runs (in random order, so
    position bias cancels out), otherwise two samples from the user's own model. A voter is
    assigned an arm like everyone else (sticky, on first exposure): a compare can be a user's
    first request, and their votes and later answers must count in one arm."""
    exp = running_experiment()
    if exp is None:
        route = route_for(user)
        return route, route
    assign(exp, user)
    pair = [Route.of(exp.control_version, exp.id, "control"), Route.of(exp.variant_version, exp.id, "variant")]
    random.shuffle(pair)
    return pair[0], pair[1]


@bp.post("/conversations/<int:conversation_id>/compare")
@chat_limit
def compare(conversation_id: int):
    data = json_body({"content", "parent_id", "message_id"})
    user = current_visitor()
    conv = own_conversation(conversation_id, user)
    user_msg = content = parent = None
    if "message_id" in data:  # compare two new answers to a question already asked
        user_msg = own_message(optional_id(data, "message_id") or 0, user)
        if user_msg.conversation_id != conv.id or user_msg.role != "user":
            raise BadRequest("'message_id' must be one of your questions in this conversation.")
    else:
        content = message_content(data)
        parent = resolve_parent(conv, data)
    # the arm is assigned (and stored) only for a request that is going to be answered
    (route_a, model_a), (route_b, model_b) = (serve(route) for route in _compare_routes(user))
    created, user_msg = user_msg is None, user_msg or add_question(conv, content, parent)
    messages = history(user_msg)
    settings = generation_settings()
    user_msg_id = user_msg.id
    rail_a, rail_b = rail_for(route_a), rail_for(route_b)
    db.session.commit()  # end the read transaction: no database connection held while generating
    try:
        # both at once: one batch when both sides are the same model, two workers side by side otherwise
        result_a, result_b = generate_chats([(model_a, messages), (model_b, messages)], settings)
        # a blocked side is regenerated alone (or refused), as the rail's settings say
        outcome_a = railed_result(rail_a, messages, result_a, lambda: generate_chat(model_a, messages, settings))
        outcome_b = railed_result(rail_b, messages, result_b, lambda: generate_chat(model_b, messages, settings))
    except Exception as exc:
        current_app.logger.exception("generation failed")
        db.session.rollback()
        if created:
            db.session.delete(db.session.get(Message, user_msg_id))
            db.session.commit()
        raise ServiceUnavailable(f"The model failed to answer ({type(exc).__name__}); please try again.") from exc
    answer_a = _save_answer(user_msg.id, route_a, outcome_a.result, outcome_a.blocks)
    answer_b = _save_answer(user_msg.id, route_b, outcome_b.result, outcome_b.blocks)
    pair = Comparison(user_id=user.id, prompt_message_id=user_msg.id, message_a_id=answer_a.id,
                      message_b_id=answer_b.id)
    db.session.add(pair)
    db.session.commit()
    # anonymous to everyone until the vote: "a" and "b" say nothing of their version or arm
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
    if not sees_arms():
        return jsonify(pair=comparison_dict(pair), continue_from=chosen)
    # after the vote an admin may learn which side was which model
    return jsonify(pair=comparison_dict(pair), continue_from=chosen,
                   answerers={"a": answerer_dict(db.session.get(Message, pair.message_a_id)),
                              "b": answerer_dict(db.session.get(Message, pair.message_b_id))})
