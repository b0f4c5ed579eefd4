"""A real Open WebUI session, recorded (tests/fixtures/open_webui/: how, in its README): the /v1
exchange Open WebUI had with this app is replayed into a fresh app the way the /v1 API stores
completions (each recorded request parsed as the API parses it, its task requests left out, and
``store_completion`` with the recorded answer), then Open WebUI's own export is imported.

Every rating matches the stored answer its rater saw -- the text Open WebUI showed, in that
person's conversation -- with its thumb, stars, reason and comment; a second import changes nothing;
each chat is one conversation whose branches are Open WebUI's (guided regenerations beside the
answer they replace, a continued answer stored whole); no task prompt is stored. No model, no
Open WebUI: seconds, on SQLite and on PostgreSQL."""
from __future__ import annotations

import json
import math

import pytest

from rlhf.generation import GenerationResult
from tests.support.app import DATABASES, database_url_for, make_app
from tests.support.paths import FIXTURES
from webapp.core.extensions import db
from webapp.core.identity import api_anon_id
from webapp.core.models import AuditEvent, Comparison, Conversation, Feedback, Message, ModelVersion
from webapp.openai_api.completions import new_job
from webapp.openai_api.frontend_tasks import is_frontend_task
from webapp.openai_api.keys import create_api_key
from webapp.openai_api.params import completion_request
from webapp.openai_api.threads import store_completion
from webapp.openai_api.users import KeyInfo, api_user, external_user
from webapp.serving.routing import generation_settings, route_for
from webapp.training.openwebui import import_ratings
from webapp.training.openwebui_export import REASON_CHIPS, REASON_LABELS, load_export

RECORDED = FIXTURES / "open_webui"
EXPORT = RECORDED / "export.json"
CLIENT = "open-webui"
# The connection headers the session was recorded with (docs/integrations/open-webui.md); without
# them the requests are those of Open WebUI's default connection.
CONNECTION_HEADERS = ("X-OpenWebUI-Message-Id", "X-OpenWebUI-User-Message-Id", "X-OpenWebUI-Task")
FINISHED = {"stop": "eos", "length": "length"}  # the recorded OpenAI finish reason -> the generation's
GUIDED = {"More Concise", "Add Details", "Use a numbered list"}  # the session's menu choices and typed change


def exchange() -> list[dict]:
    return json.loads((RECORDED / "exchange.json").read_text())["exchanges"]


def chats() -> dict[str, dict]:
    """Open WebUI's chats at the end of the session, by id (its API's ``chat`` objects)."""
    return json.loads((RECORDED / "chats.json").read_text())


def records() -> list:
    return load_export(EXPORT.read_bytes())


@pytest.fixture(params=DATABASES)
def database_url(request):
    return database_url_for(request, request.param)


@pytest.fixture
def app(tmp_path, database_url):
    overrides = {"SQLALCHEMY_DATABASE_URI": database_url} if database_url else {}
    application = make_app(tmp_path / "instance", **overrides)
    with application.app_context():  # the version that answered (never loaded: the answers are recorded)
        db.session.add(ModelVersion(name="v1-base", path=str(tmp_path / "v1-base"), kind="base", status="active"))
        db.session.commit()
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


def replay(app, connection_headers: bool = True) -> int:
    """Store each recorded chat completion as the /v1 API does (webapp.openai_api.routes.chat_completions: the
    body parsed, the end user and ids from the headers, task requests answered and not stored); the
    number stored. ``connection_headers`` False: the requests as Open WebUI's default connection
    sends them, without the recorded connection headers."""
    stored = 0
    with app.app_context():
        row, _ = create_api_key("open-webui", CLIENT, forwards_user_headers=True)
        key = KeyInfo(row.id, row.name, row.client, row.forwards_user_headers, row.rate_limit)
    for i, e in enumerate(exchange()):
        assert e["status"] == 200, e
        headers = {k: v for k, v in e["headers"].items() if connection_headers or k not in CONNECTION_HEADERS}
        with app.test_request_context("/v1/chat/completions", method="POST", json=e["request"], headers=headers):
            asked = completion_request(e["request"])
            user = api_user(key, external_user(key, e["request"]))
            job = new_job(completion_id=f"chatcmpl-recorded-{i}", model=asked.model, messages=asked.messages,
                          settings=generation_settings(), stops=asked.stop, user_id=user.id, key_id=key.id,
                          chat_id=headers.get("X-OpenWebUI-Chat-Id"),
                          external_message_id=headers.get("X-OpenWebUI-Message-Id") or None,
                          user_message_id=headers.get("X-OpenWebUI-User-Message-Id") or None,
                          include_usage=asked.include_usage,
                          frontend_task=bool(headers.get("X-OpenWebUI-Task")) or is_frontend_task(asked.messages))
            if job.frontend_task:
                continue
            text = job.said(e["answer"])  # what the client was sent, as the API stores it
            store_completion(user_id=job.user_id, key_id=job.key_id, messages=job.messages, chat_id=job.chat_id,
                             external_message_id=job.external_message_id, completion_id=job.completion_id,
                             route=route_for(user), user_message_id=job.user_message_id,
                             result=GenerationResult(text=text, token_count=len(text.split()), latency_ms=1.0,
                                                     first_token_ms=None,
                                                     finish_reason=FINISHED[e["finish_reasons"][-1]]))
            stored += 1
    return stored


def snapshot(app) -> dict:
    with app.app_context():
        fb = {(f.user_id, f.message_id): (f.thumb, f.rating, f.comment, tuple(f.reasons or ()), f.updated_at)
              for f in db.session.scalars(db.select(Feedback))}
        votes = [(c.user_id, c.message_a_id, c.message_b_id, c.winner, c.voted_at)
                 for c in db.session.scalars(db.select(Comparison).order_by(Comparison.id))]
        return {"feedback": fb, "votes": votes, "audits": db.session.scalar(db.select(db.func.count(AuditEvent.id)))}


def expected(record: dict) -> tuple:
    """What a record should become, worked out here from Open WebUI's fields (the import's mapping:
    docs/integrations/open-webui.md)."""
    data = record["data"]
    key = data.get("reason") or ""
    chips = [REASON_CHIPS[key]] if key in REASON_CHIPS else []
    parts = ([data["comment"].strip()] if (data.get("comment") or "").strip() else []) + \
        ([f"Reason: {REASON_LABELS[key]}"] if key and not chips else [])
    score = (data.get("details") or {}).get("rating")
    return ("up" if data["rating"] == 1 else "down", math.ceil(score / 2) if score else None,
            "\n".join(parts) or None, chips)


def test_the_recording_is_a_whole_session():
    """What the replay stands on: both people, every kind of request, task requests among them."""
    sent = exchange()
    chat_requests = [e for e in sent if not e["request"]["messages"][0]["content"].startswith("### Task:")]
    last = [e["request"]["messages"][-1] for e in chat_requests]
    assert len({e["headers"]["X-OpenWebUI-User-Id"] for e in sent}) == 2
    assert len(chats()) == len({e["headers"]["X-OpenWebUI-Chat-Id"] for e in sent}) >= 6
    assert len(chat_requests) < len(sent)  # titles, tags and follow-ups were asked too
    assert sum(m["role"] == "assistant" for m in last) == 2  # two Continue Response
    assert {"More Concise", "Add Details"} <= {m["content"] for m in last}
    assert {r["data"]["rating"] for r in records()} == {1, -1} and len(records()) >= 6


def check_ratings(app, recs: list, summary: dict, by: str) -> None:
    """Each matched record's answer is the one its rater saw, in their conversation, with its values."""
    with app.app_context():
        for record, result in zip(recs, summary["results"]):
            if result["status"] != "matched":
                continue
            assert result["matched_by"] == by
            chat = record["snapshot"]["chat"]["chat"]["history"]["messages"]
            rated = chat[record["meta"]["message_id"]]
            message = db.session.get(Message, result["message_id"])
            assert message.content == rated["content"].strip()  # the text Open WebUI showed its rater
            assert db.session.get(Message, message.parent_id).content == chat[rated["parentId"]]["content"].strip()
            conv = message.conversation
            assert conv.external_chat_id == record["meta"]["chat_id"]
            assert conv.user.anon_id == api_anon_id(CLIENT, record["user_id"])  # in the rater's conversation
            fb = db.session.scalars(db.select(Feedback).filter_by(message_id=message.id)).one()
            assert fb.user_id == conv.user_id
            assert (fb.thumb, fb.rating, fb.comment, fb.reasons or []) == expected(record), record["id"]


def import_twice(app, recs: list) -> dict:
    """The first import's summary, after checking that a second one changes nothing."""
    with app.app_context():
        summary = import_ratings(recs, source=str(EXPORT))
    before = snapshot(app)
    with app.app_context():
        again = import_ratings(recs, source=str(EXPORT))
    matched = summary["matched"]
    assert again["matched"] == matched and again["unmatched"] == summary["unmatched"]
    assert again["feedback"] == {"created": 0, "updated": 0, "unchanged": matched, "kept": 0}
    assert again["comparisons"]["created"] == again["comparisons"]["updated"] == 0
    assert snapshot(app) == before  # no value, no time, no vote, no audit entry changed
    return summary


def test_every_recorded_rating_matches_the_answer_its_rater_saw_and_a_second_import_changes_nothing(app):
    assert replay(app) == 15
    recs = records()
    summary = import_twice(app, recs)
    assert (summary["matched"], summary["unmatched"], summary["duplicate"]) == (len(recs), 0, 0), summary["results"]
    assert summary["feedback"]["created"] == len(recs)
    assert summary["comparisons"]["created"] >= 1  # ratings of answers with siblings are votes too
    check_ratings(app, recs, summary, "message id")


def _tree(nodes: dict, roots: list) -> list:
    """A message tree as nested [role, text, children] lists, siblings in a stable order."""
    return sorted(([nodes[i]["role"], nodes[i]["content"].strip(), _tree(nodes, nodes[i]["childrenIds"])]
                   for i in roots), key=repr)


def branches(app) -> dict[str, tuple[list, list]]:
    """Each chat's tree as stored here and as Open WebUI holds it, by chat id."""
    out = {}
    with app.app_context():
        for chat_id, chat in chats().items():
            [conv] = db.session.scalars(db.select(Conversation).filter_by(external_chat_id=chat_id))
            rows = {m.id: m for m in conv.messages}
            nodes = {i: {"role": m.role, "content": m.content,
                         "childrenIds": [c.id for c in rows.values() if c.parent_id == i]} for i, m in rows.items()}
            theirs = chat["history"]["messages"]
            out[chat_id] = (_tree(nodes, [i for i, m in rows.items() if m.parent_id is None]),
                            _tree(theirs, [i for i, m in theirs.items() if not m.get("parentId")]))
    return out


def no_task_prompt_and_one_conversation_a_chat(app) -> None:
    with app.app_context():
        texts = list(db.session.scalars(db.select(Message.content))) + \
            list(db.session.scalars(db.select(Conversation.title)))
        assert not [t for t in texts if "### Task:" in t]
        assert db.session.scalar(db.select(db.func.count(Conversation.id))) == len(chats())


def test_each_chat_is_one_conversation_with_open_webuis_branches_and_no_task_prompt(app):
    replay(app)
    for chat_id, (ours, theirs) in branches(app).items():
        assert ours == theirs, chat_id
    with app.app_context():
        kept = set(db.session.scalars(db.select(Message.guidance).where(Message.guidance.is_not(None))))
    assert kept == GUIDED  # each kept as the reason of its regeneration, none stored as a question
    no_task_prompt_and_one_conversation_a_chat(app)


def test_without_the_connection_headers_ratings_match_by_text_and_a_typed_change_is_a_follow_up(app):
    """Open WebUI's default connection sends none of the three headers: ratings match by their text,
    the menu's own labels are still recognised, and a typed change is stored as a follow-up question
    -- its rating reported, never guessed (docs/integrations/open-webui.md)."""
    assert replay(app, connection_headers=False) == 15
    typed = next(e["headers"]["X-OpenWebUI-Message-Id"] for e in exchange()
                 if e["request"]["messages"][-1]["content"] == "Use a numbered list")
    recs = records()
    summary = import_twice(app, recs)
    outcome = {r["meta"]["message_id"]: (res["status"], res.get("reason")) for r, res in zip(recs, summary["results"])}
    assert outcome.pop(typed) == ("unmatched", "message not found")
    assert set(outcome.values()) == {("matched", None)}
    check_ratings(app, recs, summary, "text")
    typed_chat = next(e["headers"]["X-OpenWebUI-Chat-Id"] for e in exchange()
                      if e["headers"]["X-OpenWebUI-Message-Id"] == typed)
    for chat_id, (ours, theirs) in branches(app).items():
        assert (ours == theirs) == (chat_id != typed_chat), chat_id
    with app.app_context():
        kept = set(db.session.scalars(db.select(Message.guidance).where(Message.guidance.is_not(None))))
        asked = set(db.session.scalars(db.select(Message.content).where(Message.role == "user")))
    assert kept == {"More Concise", "Add Details"} and "Use a numbered list" in asked
    no_task_prompt_and_one_conversation_a_chat(app)
