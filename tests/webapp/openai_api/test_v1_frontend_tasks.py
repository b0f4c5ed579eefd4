"""Open WebUI's own requests (chat titles, tags, follow-up suggestions...) through /v1: answered, never
stored. With task generation on (Open WebUI's default) 10 of 15 stored questions of a real session
were such prompts and conversation titles read "Task: Generate a concise title..."."""
from __future__ import annotations

import pytest

from tests.webapp.openai_api.test_v1_api import MODEL, RICE, V1, stream_events
from webapp.core.extensions import db
from webapp.core.models import ApiKey, Conversation, Message
from webapp.openai_api.frontend_tasks import is_frontend_task

# Open WebUI 0.12.4's default title template (its DEFAULT_TITLE_GENERATION_PROMPT_TEMPLATE), as it fills it in
TITLE_TASK = """### Task:
Generate a concise title summarizing the chat history.
### Guidelines:
- The title should clearly represent the main theme or subject of the conversation.
- Keep it short: 2-4 words is best.
### Output:
JSON format: { "title": "your concise title here" }
### Chat History:
<chat_history>
USER: How do I cook rice?
ASSISTANT: Rinse it, then simmer one cup in two cups of water for 15 minutes.
</chat_history>"""
FOLLOW_UPS = "### Task:\nPredict 3-5 useful messages this user might naturally send next ..."
EMOJI = "Your task is to reflect the speaker's likely facial expression through a fitting emoji. Interpret ..."


def counts(v1: V1) -> tuple[int, int, int]:
    return v1.db(lambda: (db.session.scalar(db.select(db.func.count(Conversation.id))),
                          db.session.scalar(db.select(db.func.count(Message.id))),
                          db.session.scalars(db.select(ApiKey.request_count).filter_by(name="owui")).one()))


def test_a_front_ends_task_requests_are_answered_and_never_stored(v1):
    chat = {"X-OpenWebUI-Chat-Id": "chat-1", "X-OpenWebUI-User-Id": "ann"}
    asked = v1.complete(RICE, key="owui", headers=chat)  # the person's question: stored
    conversations, messages, used = counts(v1)
    assert (conversations, messages) == (1, 2)

    for content, stream in ((TITLE_TASK, False), (FOLLOW_UPS, True), (EMOJI, False)):
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream}
        resp = v1.post("/v1/chat/completions", body, "owui", chat)
        assert resp.status_code == 200
        answer = stream_events(resp)[-2] if stream else resp.get_json()
        assert answer["id"].startswith("chatcmpl-")
        if not stream:
            assert answer["choices"][0]["message"]["role"] == "assistant"
            rated = v1.post("/v1/feedback", {"completion_id": answer["id"], "thumb": "up"}, "owui", chat)
            assert rated.status_code == 404  # nothing stored to rate
    conversations_after, messages_after, used_after = counts(v1)
    assert (conversations_after, messages_after) == (1, 2)  # no turn, no branch, no conversation
    assert used_after == used + 3  # the key's use still counts them
    title = v1.db(lambda: db.session.scalars(db.select(Conversation.title)).one())
    assert "Task" not in title

    v1.complete(RICE + [{"role": "assistant", "content": v1.db(
        lambda: db.session.scalars(db.select(Message.content).filter_by(completion_id=asked["id"])).one())},
        {"role": "user", "content": "And brown rice?"}], key="owui", headers=chat)
    assert counts(v1)[:2] == (1, 4)  # the chat goes on where it was


@pytest.mark.parametrize("messages,task", [
    ([{"role": "user", "content": TITLE_TASK}], True),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  " + FOLLOW_UPS}], True),
    ([{"role": "user", "content": "How do I cook rice?"}], False),
    # a person's chat that mentions a task is a chat
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"},
      {"role": "user", "content": TITLE_TASK}], False),
    ([{"role": "user", "content": "Please write a ### Task: heading"}], False),
])
def test_what_counts_as_a_task(messages, task):
    assert is_frontend_task(messages) is task
