"""Completions as conversation turns: where an answer of the /v1 API is stored.

A client sends the whole conversation with every request; it is threaded into the user's stored
conversations so that training, the experiment metrics, the feedback browser and the exports see
API traffic as they see the chat page's. With ``X-OpenWebUI-Chat-Id`` the front end's chat is one
conversation: its messages are matched from the root down (role and text), and whatever does not
match yet (an edited question, a front end's earlier turns) becomes a new branch. Without it, a
request whose history (all but the last message) is the stored history of one of the user's
messages continues there; anything else starts a new conversation. A question that is already
stored where it attaches is answered again (a regenerate: a sibling answer, as on the chat page).

Two requests of Open WebUI's are not new turns, though they look like one:

- **A guided regeneration** ("More Concise", "Add Details" or a typed change in its regenerate menu)
  sends the history, the answer to replace and the instruction as a last user message. Open WebUI
  shows the new answer beside the old one (2 / 2 under the same question), so it is stored there: a
  sibling of the old answer, with the instruction as its ``guidance``. Recognised exactly by the
  question's id (``X-OpenWebUI-User-Message-Id``, a connection header set to ``{{USER_MESSAGE_ID}}``:
  it names the question answered, not the instruction), else by the menu's own labels.
- **Continue Response** sends the history ending with the answer so far (role ``assistant``). The
  reply is its continuation; the stored answer becomes the whole text, as Open WebUI shows it.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Sequence

from rlhf.generation import GenerationResult
from rlhf.safety import Block
from webapp.chat.conversations import clean_title, store_answer
from webapp.core.extensions import db
from webapp.core.models import Conversation, Message, history, utcnow
from webapp.openai_api.keys import record_use
from webapp.safety.rail import record_interventions
from webapp.serving.routing import Route

MAX_CANDIDATES = 20  # stored messages with the history's last text tried, newest first
# Open WebUI's regenerate menu (RegenerateMenu.svelte): the instructions it sends as they read in English.
# Other languages, and typed changes, are recognised by the question's id header (module docstring).
GUIDED_REGENERATION_LABELS = frozenset({"more concise", "add details"})


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


def _asked(user_id: int, external_id: str, chat_id: str | None) -> Message | None:
    """The user's stored question that a front end knows as ``external_id`` (in its chat, when named)."""
    query = (db.select(Message).join(Conversation, Message.conversation_id == Conversation.id)
             .where(Conversation.user_id == user_id, Conversation.deleted_at.is_(None), Message.role == "user",
                    Message.external_message_id == external_id))
    if chat_id:
        query = query.where(Conversation.external_chat_id == chat_id)
    return db.session.scalars(query.order_by(Message.id.desc())).first()


def guidance_of(user_id: int, messages: Sequence[dict[str, str]], chat_id: str | None,
                user_message_id: str | None) -> str | None:
    """The instruction when a request is a guided regeneration ([..., question, answer, instruction]),
    else None. With the question's id header, the stored question with that id decides (the request
    answers it, not its last message); without the header, the instruction is one of the regenerate
    menu's labels."""
    if len(messages) < 3 or [m["role"] for m in messages[-3:]] != ["user", "assistant", "user"]:
        return None
    instruction = messages[-1]["content"]
    if user_message_id:  # the id of a question not stored yet is a new question's: a turn, not guidance
        known = _asked(user_id, user_message_id, chat_id)
        return (instruction if known is not None and known.content == messages[-3]["content"]
                and known.content != instruction else None)
    return instruction if instruction.strip().casefold() in GUIDED_REGENERATION_LABELS else None


def attach(user_id: int, messages: Sequence[dict[str, str]], chat_id: str | None,
           user_message_id: str | None = None) -> Message:
    """The stored question of a request (added to the session, not committed): found or written
    with whatever part of the request's conversation is not stored yet. ``user_message_id`` (the
    front end's id of the question) is kept on a question stored without one."""
    question = _attach(user_id, messages, chat_id)
    if user_message_id and question.external_message_id is None:
        question.external_message_id = user_message_id
    return question


def _attach(user_id: int, messages: Sequence[dict[str, str]], chat_id: str | None) -> Message:
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


def continued_answer(user_id: int, messages: Sequence[dict[str, str]], chat_id: str | None) -> Message | None:
    """The user's stored answer that a continue request ends with: on the path of ``messages`` in the
    chat's conversation, or (no chat id) the stored message whose history is exactly ``messages``."""
    if chat_id:
        conv = _chat(user_id, chat_id)
        if conv is None:
            return None
        node, matched = _walk(conv, messages)
        return node if node is not None and matched == len(messages) and node.role == "assistant" else None
    return _continued(user_id, messages)


def _store_continuation(*, user_id: int, key_id: int, messages: Sequence[dict[str, str]], chat_id: str | None,
                        external_message_id: str | None, user_message_id: str | None, completion_id: str,
                        route: Route, result: GenerationResult, blocks: Sequence[Block]) -> Message:
    """A continuation (``result.text``, its leading space kept) stored as one answer: the stored answer
    it continues, when the same version gave it, becomes the whole text; otherwise (an edited or
    unknown answer so far, or another version serving now) the whole text is a new answer to the question."""
    whole = (messages[-1]["content"] + result.text).rstrip()
    answer = continued_answer(user_id, messages, chat_id)
    if answer is None or answer.model_version_id != route.version_id:
        question = attach(user_id, messages[:-1], chat_id, user_message_id)
        return store_answer(question, route, replace(result, text=whole), blocks, api_key_id=key_id,
                            completion_id=completion_id, external_message_id=external_message_id)
    answer.content = whole
    answer.token_count = (answer.token_count or 0) + result.token_count
    answer.finish_reason = result.finish_reason  # how the whole answer ends now
    if answer.external_message_id is None:
        answer.external_message_id = external_message_id
    answer.conversation.updated_at = utcnow()
    if blocks:
        record_interventions(blocks, message_id=answer.id, user_id=user_id, conversation_id=answer.conversation_id,
                             version_id=route.version_id)
    db.session.commit()
    return answer


def store_completion(*, user_id: int, key_id: int, messages: Sequence[dict[str, str]], chat_id: str | None,
                     external_message_id: str | None, completion_id: str, route: Route, result: GenerationResult,
                     blocks: Sequence[Block] = (), user_message_id: str | None = None) -> Message:
    """Store a completion (``result.text``: what the client was sent) as the answer to its
    conversation's question -- a guided regeneration beside the answer it replaces, a continuation as
    the answer it continues (module docstring) --, count the key's request, and commit."""
    record_use(key_id)
    if messages[-1]["role"] == "assistant":
        return _store_continuation(user_id=user_id, key_id=key_id, messages=messages, chat_id=chat_id,
                                   external_message_id=external_message_id, user_message_id=user_message_id,
                                   completion_id=completion_id, route=route, result=result, blocks=blocks)
    guidance = guidance_of(user_id, messages, chat_id, user_message_id)
    question = attach(user_id, messages[:-2] if guidance else messages, chat_id, user_message_id)
    return store_answer(question, route, result, blocks, api_key_id=key_id, completion_id=completion_id,
                        external_message_id=external_message_id, guidance=guidance)
