"""Completions as conversation turns: where an answer of the /v1 API is stored.

A client sends the whole conversation with every request; it is threaded into the user's stored
conversations so that training, the experiment metrics, the feedback browser and the exports see
API traffic as they see the chat page's. With ``X-OpenWebUI-Chat-Id`` the front end's chat is one
conversation: its messages are matched from the root down (role and text), and whatever does not
match yet (an edited question, a front end's earlier turns) becomes a new branch. Without it, a
request whose history (all but the last message) is the stored history of one of the user's
messages continues there; anything else starts a new conversation. A question that is already
stored where it attaches is answered again (a regenerate: a sibling answer, as on the chat page).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from rlhf.generation import GenerationResult
from rlhf.safety import Block

from webapp.api.keys import record_use
from webapp.chat.conversations import clean_title, store_answer
from webapp.core.extensions import db
from webapp.core.models import Conversation, Message, history
from webapp.serving.routing import Route

MAX_CANDIDATES = 20  # stored messages with the history's last text tried, newest first


def _chat(user_id: int, chat_id: str) -> Conversation | None:
    return db.session.scalars(db.select(Conversation).filter_by(user_id=user_id, external_chat_id=chat_id,
                                                                deleted_at=None)
                              .order_by(Conversation.id.desc())).first()


def _walk(conv: Conversation, messages: Sequence[dict[str, str]]) -> tuple[Message | None, int]:
    """The deepest stored message on the path of ``messages`` from the conversation's root, and how
    many of them it matched (where several siblings match, the newest)."""
    children: dict[int | None, list[Message]] = defaultdict(list)
    for m in db.session.scalars(db.select(Message).filter_by(conversation_id=conv.id).order_by(Message.id.desc())):
        children[m.parent_id].append(m)
    node, matched = None, 0
    for m in messages:
        nxt = next((c for c in children[node.id if node else None]
                    if c.role == m["role"] and c.content == m["content"]), None)
        if nxt is None:
            break
        node, matched = nxt, matched + 1
    return node, matched


def _continued(user_id: int, past: Sequence[dict[str, str]]) -> Message | None:
    """The user's stored message (in a live conversation) whose history is exactly ``past``."""
    last = past[-1]
    candidates = db.session.scalars(
        db.select(Message).join(Conversation, Message.conversation_id == Conversation.id)
        .where(Conversation.user_id == user_id, Conversation.deleted_at.is_(None), Message.role == last["role"],
               Message.content == last["content"])
        .order_by(Message.id.desc()).limit(MAX_CANDIDATES))
    wanted = [(m["role"], m["content"]) for m in past]
    for candidate in candidates:
        if [(m["role"], m["content"]) for m in history(candidate)] == wanted:
            return candidate
    return None


def attach(user_id: int, messages: Sequence[dict[str, str]], chat_id: str | None) -> Message:
    """The stored question of a request (added to the session, not committed): found or written
    with whatever part of the request's conversation is not stored yet."""
    conv, node, matched = None, None, 0
    if chat_id:
        conv = _chat(user_id, chat_id)
        if conv is not None:
            node, matched = _walk(conv, messages)
    elif len(messages) > 1:
        node = _continued(user_id, messages[:-1])
        if node is not None:
            conv, matched = node.conversation, len(messages) - 1
            asked = next((c for c in db.session.scalars(db.select(Message).filter_by(parent_id=node.id, role="user")
                                                        .order_by(Message.id.desc()))
                          if c.content == messages[-1]["content"]), None)
            if asked is not None:
                node, matched = asked, len(messages)
    if conv is None:
        first = next(m["content"] for m in messages if m["role"] == "user")
        conv = Conversation(user_id=user_id, title=clean_title(first), external_chat_id=chat_id)
        db.session.add(conv)
        db.session.flush()
    for m in messages[matched:]:
        node = Message(conversation_id=conv.id, role=m["role"], content=m["content"],
                       parent_id=node.id if node else None)
        db.session.add(node)
        db.session.flush()
    assert node is not None
    return node


def store_completion(*, user_id: int, key_id: int, messages: Sequence[dict[str, str]], chat_id: str | None,
                     external_message_id: str | None, completion_id: str, route: Route, result: GenerationResult,
                     blocks: Sequence[Block] = ()) -> Message:
    """Store a completion (``result.text``: what the client was sent) as the answer to its
    conversation's question, count the key's request, and commit."""
    question = attach(user_id, messages, chat_id)
    record_use(key_id)
    return store_answer(question, route, result, blocks, api_key_id=key_id, completion_id=completion_id,
                        external_message_id=external_message_id)
