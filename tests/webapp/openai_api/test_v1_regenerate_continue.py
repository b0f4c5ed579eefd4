"""Open WebUI's guided regenerations and "Continue Response" through /v1, stored as the person sees them.

A guided regeneration ("More Concise", "Add Details", a typed change) arrives as [question, old answer,
instruction]; Open WebUI shows the new answer beside the old one under the question, so it must be
stored there -- never as a reply to the instruction, which made its rating "message not found" and
its training pair one whose prompt held its own rejected answer. A continue arrives ending with the
answer so far; it was refused ("The last message must be the user's question")."""
from __future__ import annotations

import pytest

from rlhf.data.datasets import build_datasets
from tests.webapp.openai_api.test_v1_api import MODEL, RICE, V1, error_of, rows, stream_events
from webapp.core.extensions import db
from webapp.core.models import Conversation, Feedback, Message, User
from webapp.training.records import feedback_records

CHAT = {"X-OpenWebUI-Chat-Id": "chat-7", "X-OpenWebUI-User-Id": "ann"}


def said(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


def stored(v1: V1, completion_id: str) -> Message:
    return v1.db(lambda: db.session.scalars(db.select(Message).filter_by(completion_id=completion_id)).one())


def test_a_guided_regeneration_is_a_sibling_of_the_answer_it_replaces(v1):
    first = v1.complete(RICE, key="owui", headers=CHAT)
    old = said(first)
    asked = RICE + [{"role": "assistant", "content": old}]
    concise = v1.complete(asked + [{"role": "user", "content": "More Concise"}], key="owui", headers=CHAT)
    details = v1.complete(asked + [{"role": "user", "content": "add details "}], key="owui", headers=CHAT)

    a, b, c = (stored(v1, x["id"]) for x in (first, concise, details))
    assert a.parent_id == b.parent_id == c.parent_id  # 1 / 3, 2 / 3, 3 / 3 under "How do I cook rice?"
    assert (a.guidance, b.guidance, c.guidance) == (None, "More Concise", "add details")
    texts = [m.content for m in rows(v1, Message, role="user")]
    assert texts == ["How do I cook rice?"]  # no instruction stored as a question
    assert len(rows(v1, Conversation)) == 1

    # the chat goes on from the new answer, as Open WebUI sends it next
    follow = v1.complete(RICE + [{"role": "assistant", "content": said(concise)},
                                 {"role": "user", "content": "And brown rice?"}], key="owui", headers=CHAT)
    assert stored(v1, follow["id"]).parent_id == v1.db(lambda: db.session.scalars(
        db.select(Message.id).filter_by(role="user", content="And brown rice?")).one())
    assert v1.db(lambda: db.session.get(Message, stored(v1, follow["id"]).parent_id).parent_id) == b.id
    # a follow-up that is not one of the menu's labels is a turn of its own
    turn = v1.complete(asked + [{"role": "user", "content": "Is it gluten-free?"}], key="owui", headers=CHAT)
    assert stored(v1, turn["id"]).guidance is None
    assert v1.db(lambda: db.session.get(Message, stored(v1, turn["id"]).parent_id).parent_id) == a.id


def test_the_questions_id_header_recognises_a_typed_change_exactly(v1):
    ids = {**CHAT, "X-OpenWebUI-User-Message-Id": "u-1"}
    first = v1.complete(RICE, key="owui", headers=ids)
    question = v1.db(lambda: db.session.scalars(db.select(Message).filter_by(role="user")).one())
    assert question.external_message_id == "u-1"
    asked = RICE + [{"role": "assistant", "content": said(first)}]
    change = v1.complete(asked + [{"role": "user", "content": "Say it as a haiku"}], key="owui", headers=ids)
    assert stored(v1, change["id"]).guidance == "Say it as a haiku"
    assert stored(v1, change["id"]).parent_id == question.id
    # a new question's id (not stored yet) is a turn, even when its text reads like a menu label
    turn = v1.complete(asked + [{"role": "user", "content": "More concise"}], key="owui",
                       headers={**CHAT, "X-OpenWebUI-User-Message-Id": "u-2"})
    assert stored(v1, turn["id"]).guidance is None
    asked_again = v1.db(lambda: db.session.get(Message, stored(v1, turn["id"]).parent_id))
    assert (asked_again.content, asked_again.external_message_id) == ("More concise", "u-2")
    # Try Again on the first question (its own id, the history ending with it): a plain sibling
    again = v1.complete(RICE, key="owui", headers=ids)
    assert stored(v1, again["id"]).parent_id == question.id and stored(v1, again["id"]).guidance is None


def test_no_training_pair_holds_its_own_rejected_answer_in_its_prompt(v1):
    first = v1.complete(RICE, key="owui", headers=CHAT)
    concise = v1.complete(RICE + [{"role": "assistant", "content": said(first)},
                                  {"role": "user", "content": "More Concise"}], key="owui", headers=CHAT)
    old, new = stored(v1, first["id"]), stored(v1, concise["id"])
    owner = v1.db(lambda: db.session.get(Conversation, old.conversation_id).user_id)
    v1.db(lambda: (db.session.add_all([Feedback(user_id=owner, message_id=old.id, thumb="down"),
                                       Feedback(user_id=owner, message_id=new.id, thumb="up")]),
                   db.session.commit()))
    records = v1.db(lambda: feedback_records())
    assert [m.guidance for m in records[0].messages if m.role == "assistant"] == [None, "More Concise"]
    pairs = [row for split in ("train", "eval") for row in build_datasets(records).pairs[split]]
    assert pairs, "the two rated siblings make a pair"
    for row in pairs:
        prompt = str(row["prompt"])
        assert old.content not in prompt and "More Concise" not in prompt


def test_continue_response_extends_the_answer_it_continues(v1):
    first = v1.complete(RICE, key="owui", headers=CHAT, max_tokens=6)
    answer, tokens = stored(v1, first["id"]), first["usage"]["completion_tokens"]
    # the micro model may end at once (a continuation can be empty): ask again until it says something, every
    # time checking that the stored answer is the whole text Open WebUI shows
    for seed in range(8):
        before = answer.content
        more = v1.complete(RICE + [{"role": "assistant", "content": before}], key="owui", headers=CHAT,
                           max_tokens=8, seed=seed)
        answer, tokens = stored(v1, first["id"]), tokens + more["usage"]["completion_tokens"]
        assert answer.content == (before + said(more)).rstrip() and stored_count(v1, more["id"]) == 0
        if said(more).strip():
            break
    else:
        raise AssertionError("no continuation in 8 tries")
    assert len(rows(v1, Message, role="assistant")) == 1 and answer.token_count == tokens

    # streamed, the chunks are the continuation only, and the answer grows again
    for seed in range(8):
        before = answer.content
        resp = v1.post("/v1/chat/completions", {"model": MODEL, "stream": True, "max_tokens": 8, "seed": seed,
                                                "messages": RICE + [{"role": "assistant", "content": before}]},
                       "owui", CHAT)
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in stream_events(resp)[:-1] if e["choices"])
        answer = stored(v1, first["id"])
        assert answer.content == (before + text).rstrip()
        if text.strip():
            break
    else:
        raise AssertionError("no streamed continuation in 8 tries")


def stored_count(v1: V1, completion_id: str) -> int:
    return v1.db(lambda: db.session.scalar(db.select(db.func.count(Message.id)).filter_by(completion_id=completion_id)))


def test_continuing_an_answer_nobody_stored_stores_the_whole_text_as_a_new_answer(v1):
    first = v1.complete(RICE, user="bo")
    edited = "Rinse a cup of rice"  # the person edited the answer before asking to continue it
    more = v1.complete(RICE + [{"role": "assistant", "content": edited}], user="bo", max_tokens=8)
    new = stored(v1, more["id"])
    assert new.content == (edited + said(more)).rstrip()
    # a single question without a chat id starts a conversation (as a new question would): the answer is its
    assert v1.db(lambda: db.session.get(Message, new.parent_id).content) == "How do I cook rice?"
    assert stored(v1, first["id"]).content != new.content
    # without a chat id, a continue of a stored answer finds it by its history
    again = v1.complete(RICE + [{"role": "assistant", "content": new.content}], user="bo", max_tokens=4)
    assert stored(v1, more["id"]).content == (new.content + said(again)).rstrip()
    assert len(rows(v1, Message, role="assistant")) == 2


@pytest.mark.parametrize("messages", [
    [{"role": "assistant", "content": "Hello"}],  # nothing was asked
    RICE + [{"role": "assistant", "content": "  "}],  # nothing to continue
])
def test_a_continue_needs_a_question_and_an_answer_so_far(v1, messages):
    assert error_of(v1.post("/v1/chat/completions", {"model": MODEL, "messages": messages}), 400)["param"] == "messages"
    assert rows(v1, Message) == []


def test_a_task_header_marks_a_front_ends_own_request(v1):
    v1.complete([{"role": "user", "content": "Suggest three follow-up questions about rice."}], key="owui",
                headers={**CHAT, "X-OpenWebUI-Task": "follow_up_generation"})
    v1.complete(RICE, key="owui", headers={**CHAT, "X-OpenWebUI-Task": ""})  # a chat request: the header is empty
    assert [m.content for m in rows(v1, Message, role="user")] == ["How do I cook rice?"]
    assert len(rows(v1, User)) == 1


def test_an_answer_cut_at_the_limit_is_stored_and_shown_as_cut(v1):
    for seed in range(8):  # the micro model may end at once (EOS as its first token): try until it is cut
        cut = v1.complete(RICE, key="owui", headers=CHAT, max_tokens=1, seed=seed)
        if cut["choices"][0]["finish_reason"] == "length":
            break
    else:
        raise AssertionError("no answer was cut at 1 token in 8 tries")
    answer = stored(v1, cut["id"])
    assert answer.finish_reason == "length"
    from webapp.chat.conversations import message_dict
    assert v1.db(lambda: message_dict(db.session.get(Message, answer.id))["cut"]) is True
    # continued to its end, it is no longer cut
    for seed in range(8):
        more = v1.complete(RICE + [{"role": "assistant", "content": stored(v1, cut["id"]).content}], key="owui",
                           headers=CHAT, max_tokens=40, seed=seed)
        reason = stored(v1, cut["id"]).finish_reason
        assert (reason == "length") == (more["choices"][0]["finish_reason"] == "length")
        if reason != "length":
            break
    else:
        raise AssertionError("the micro model never ended an answer in 8 tries of 40 tokens")
    assert reason in ("eos", "stop_string")
