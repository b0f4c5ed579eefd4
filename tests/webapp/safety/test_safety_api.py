"""The output rail through the chat API and the admin's Safety page (Flask client, the micro model).

The micro model writes gibberish; to make it write a blocked text deterministically, a test first
learns what it answers for a seed (torch's global generator, which the batching worker samples
with), then blocks a piece of that answer and asks again with the same seed.
"""
from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from tests.support.admin import PASSWORD, login
from tests.support.app import ApiClient, make_app, register_model, sse_events
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import AuditEvent, Message, RailIntervention, RailRule

SEED = 1234
QUESTION = "How do I cook rice?"
REFUSAL = "REFUSED BY THE RAIL."
SSE_WORDS = "event token data text rail type action refused regenerating done user_message_id message_id " \
            "finish_reason token_count latency_ms content " + REFUSAL


def new_conv(api) -> int:
    return api.post("/api/conversations", json={}).get_json()["id"]


def seeded_answer(api, seed: int = SEED) -> str:
    torch.manual_seed(seed)
    resp = api.post(f"/api/conversations/{new_conv(api)}/messages", json={"content": QUESTION, "stream": False})
    assert resp.status_code == 201
    return resp.get_json()["assistant_message"]["content"]


def blocked_piece(answer: str) -> tuple[str, int] | None:
    """A run of 5+ letters from ``answer`` (after its start) that the SSE framing never contains, and
    where it first occurs (None: the answer has none)."""
    for m in re.finditer(r"[A-Za-z]{5,}", answer):
        piece = m.group(0)[:6]
        if m.start() > 0 and piece.lower() not in SSE_WORDS.lower():
            return piece, answer.index(piece)
    return None


def whole_word(answer: str) -> str | None:
    words = re.findall(r"(?<!\S)[A-Za-z]{3,}(?!\S)", answer)
    return words[0] if words else None


def usable_answer(api, pick) -> tuple[int, str, Any]:
    """The first seed from SEED on whose answer has something for ``pick`` to block: the seed, the answer
    and what ``pick`` found. Never a skip: a micro model whose answers never give one fails the test."""
    tried = []
    for seed in range(SEED, SEED + 20):
        answer = seeded_answer(api, seed)
        found = pick(answer)
        if found is not None:
            return seed, answer, found
        tried.append(answer)
    raise AssertionError(f"no answer of 20 seeds had anything to block: {tried!r}")


def add_rule(app, kind: str, value: str) -> None:
    with app.app_context():
        db.session.add(RailRule(kind=kind, value=value))
        db.session.commit()


def interventions(app) -> list[RailIntervention]:
    with app.app_context():
        rows = db.session.scalars(db.select(RailIntervention).order_by(RailIntervention.id)).all()
        db.session.expunge_all()
        return rows


@pytest.fixture
def rail_app(tmp_path, micro_model_dir):
    app = make_app(tmp_path / "instance", RLHF_RAIL_REFUSAL_TEXT=REFUSAL)
    register_model(app, micro_model_dir)
    return app


@pytest.fixture
def rail_api(rail_app):
    return ApiClient(rail_app.test_client())


def test_streamed_answer_hitting_a_rule_never_sends_the_blocked_text(rail_app, rail_api):
    seed, answer, (piece, at) = usable_answer(rail_api, blocked_piece)
    add_rule(rail_app, "pattern", re.escape(piece))
    torch.manual_seed(seed)
    conv = new_conv(rail_api)
    resp = rail_api.post(f"/api/conversations/{conv}/messages", json={"content": QUESTION})
    raw = resp.get_data()  # the bytes the client receives
    assert resp.status_code == 200 and piece.encode() not in raw and piece.lower().encode() not in raw.lower()
    events = sse_events(resp)
    sent = "".join(d["text"] for e, d in events if e == "token")
    assert answer.startswith(sent.strip()) and len(sent) <= at  # what came before it was released (no more)
    assert ("rail", {"type": "rail", "action": "refused", "text": REFUSAL}) in events
    done = events[-1]
    assert done[0] == "done" and done[1]["content"] == REFUSAL and done[1]["finish_reason"] == "rail"
    with rail_app.app_context():
        stored = db.session.get(Message, done[1]["message_id"])
        assert stored.content == REFUSAL  # what the user saw
    [row] = interventions(rail_app)
    assert row.message_id == done[1]["message_id"] and row.conversation_id == conv
    assert row.reason == f"pattern: {re.escape(piece)}" and row.action == "refused" and row.kind == "pattern"
    assert piece in row.blocked_text and row.user_id == rail_api.user_id and row.model_version_id == 1
    history = rail_api.get(f"/api/conversations/{conv}").get_json()["messages"]
    assert [m["content"] for m in history] == [QUESTION, REFUSAL]


def test_non_streamed_answer_hitting_a_phrase_is_refused(rail_app, rail_api):
    seed, answer, word = usable_answer(rail_api, whole_word)
    words = [word]
    add_rule(rail_app, "phrase", words[0].upper())  # case-insensitive
    torch.manual_seed(seed)
    resp = rail_api.post(f"/api/conversations/{new_conv(rail_api)}/messages",
                         json={"content": QUESTION, "stream": False})
    assert resp.status_code == 201
    body = resp.get_json()
    assert body["assistant_message"]["content"] == REFUSAL and words[0] not in resp.get_data(as_text=True)
    [row] = interventions(rail_app)
    assert row.reason == f"phrase: {words[0].upper()}" and row.message_id == body["assistant_message"]["id"]
    assert row.blocked_text == answer


def test_the_rail_off_shows_answers_unchecked(tmp_path, micro_model_dir):
    app = make_app(tmp_path / "instance", RLHF_RAIL_ENABLED=False)
    register_model(app, micro_model_dir)
    api = ApiClient(app.test_client())
    add_rule(app, "pattern", r"\S")
    assert seeded_answer(api) != "" and interventions(app) == []


@pytest.fixture
def regen_app(tmp_path, micro_model_dir):
    app = make_app(tmp_path / "instance", RLHF_RAIL_REFUSAL_TEXT=REFUSAL, RLHF_RAIL_ACTION="regenerate",
                   RLHF_RAIL_REGENERATE_ATTEMPTS=2)
    register_model(app, micro_model_dir)
    return app


def test_regenerate_mode_streams_a_new_answer_after_a_blocked_one(regen_app):
    api = ApiClient(regen_app.test_client())
    seed, answer, (piece, _) = usable_answer(api, blocked_piece)
    add_rule(regen_app, "pattern", re.escape(piece))
    torch.manual_seed(seed)  # the first attempt is ``answer`` again (blocked); the second samples on
    resp = api.post(f"/api/conversations/{new_conv(api)}/messages", json={"content": QUESTION})
    assert piece.encode() not in resp.get_data()
    events = sse_events(resp)
    assert ("rail", {"type": "rail", "action": "regenerating", "text": ""}) in events
    after = events[[e for e, _ in events].index("rail") + 1:]
    done = events[-1][1]
    assert done["content"] not in ("", REFUSAL) and piece not in done["content"]
    assert "".join(d["text"] for e, d in after if e == "token").strip() == done["content"]
    [row] = interventions(regen_app)
    assert (row.action, row.attempt, row.message_id) == ("regenerated", 0, done["message_id"])


def test_regenerate_mode_refuses_after_the_last_attempt(regen_app):
    api = ApiClient(regen_app.test_client())
    add_rule(regen_app, "pattern", r"\S")  # every answer is blocked
    conv = new_conv(api)
    streamed = sse_events(api.post(f"/api/conversations/{conv}/messages", json={"content": QUESTION}))
    assert [d["action"] for e, d in streamed if e == "rail"] == ["regenerating", "regenerating", "refused"]
    assert not [d for e, d in streamed if e == "token"] and streamed[-1][1]["content"] == REFUSAL
    first = streamed[-1][1]["message_id"]
    again = api.post(f"/api/messages/{first}/regenerate", json={"stream": False})
    assert again.status_code == 201 and again.get_json()["assistant_message"]["content"] == REFUSAL
    rows = interventions(regen_app)
    assert [(r.action, r.attempt) for r in rows] == [("regenerated", 0), ("regenerated", 1), ("refused", 2)] * 2
    assert {r.message_id for r in rows} == {first, again.get_json()["assistant_message"]["id"]}


def test_compare_answers_go_through_the_rail(rail_app, rail_api):
    add_rule(rail_app, "pattern", r"\S")
    resp = rail_api.post(f"/api/conversations/{new_conv(rail_api)}/compare", json={"content": QUESTION})
    assert resp.status_code == 201
    body = resp.get_json()
    assert body["a"]["content"] == REFUSAL and body["b"]["content"] == REFUSAL
    assert sorted(r.message_id for r in interventions(rail_app)) == sorted([body["a"]["id"], body["b"]["id"]])


def test_edit_and_regenerate_streams_go_through_the_rail(rail_app, rail_api):
    add_rule(rail_app, "pattern", r"\S")
    conv = new_conv(rail_api)
    first = sse_events(rail_api.post(f"/api/conversations/{conv}/messages", json={"content": QUESTION}))[-1][1]
    regen = sse_events(rail_api.post(f"/api/messages/{first['message_id']}/regenerate", json={}))
    edit = sse_events(rail_api.post(f"/api/messages/{first['user_message_id']}/edit", json={"content": "Other?"}))
    for events in (regen, edit):
        assert events[-1][1]["content"] == REFUSAL and not [d for e, d in events if e == "token"]
    assert len(interventions(rail_app)) == 3


# ---------------------------------------------------------------------------- the admin's Safety page

@pytest.fixture
def admin(rail_app):
    with rail_app.app_context():
        set_admin_password("root", PASSWORD)
    client, token, resp = login(rail_app)
    assert resp.status_code == 302
    return client, token


def test_safety_page_needs_an_admin(rail_app, rail_api):
    for url in ("/admin/safety/",):
        assert rail_api.get(url).status_code == 302  # to the login page
    visitor = rail_app.test_client()
    token = rail_api.csrf
    for url, data in (("/admin/safety/rules", {"kind": "phrase", "value": "x"}), ("/admin/safety/presets/email", {}),
                      ("/admin/safety/rules/1/delete", {}), ("/admin/safety/rules/1/toggle", {})):
        resp = rail_api.client.post(url, data={**data, "csrf_token": token})
        assert resp.status_code in (302, 400) and "/admin/login" in resp.headers.get("Location", "/admin/login")
        assert visitor.post(url, data=data).status_code in (302, 400)
    with rail_app.app_context():
        assert db.session.query(RailRule).count() == 0


def test_safety_page_rules_crud_with_audit(rail_app, admin):
    client, token = admin
    page = client.get("/admin/safety/")
    assert page.status_code == 200 and b"Latest interventions" in page.data and b"IBAN" in page.data
    resp = client.post("/admin/safety/rules", data={"kind": "phrase", "value": "  secret sauce ", "csrf_token": token})
    assert resp.status_code == 303
    resp = client.post("/admin/safety/rules", data={"kind": "pattern", "value": r"code\d{4}", "csrf_token": token})
    assert resp.status_code == 303
    with rail_app.app_context():
        rules = {r.value: r.id for r in db.session.scalars(db.select(RailRule))}
    assert set(rules) == {"secret sauce", r"code\d{4}"}
    assert client.post("/admin/safety/rules", data={"kind": "phrase", "value": "secret sauce",
                                                    "csrf_token": token}).status_code == 409
    assert client.post(f"/admin/safety/rules/{rules['secret sauce']}/toggle",
                       data={"csrf_token": token}).status_code == 303
    pattern_id = rules[r"code\d{4}"]
    assert client.post(f"/admin/safety/rules/{pattern_id}/delete", data={"csrf_token": token}).status_code == 303
    assert client.post("/admin/safety/presets/email", data={"enabled": "0", "csrf_token": token}).status_code == 303
    assert client.post("/admin/safety/presets/nope", data={"enabled": "0", "csrf_token": token}).status_code == 404
    assert client.post("/admin/safety/rules/999/delete", data={"csrf_token": token}).status_code == 404
    with rail_app.app_context():
        from webapp.safety.rail import preset_states, rule_specs

        assert [(r.value, r.enabled)
                for r in db.session.scalars(db.select(RailRule).where(RailRule.kind != "preset"))] \
            == [("secret sauce", False)]
        assert preset_states()["email"] is False and ("preset", "email") not in rule_specs()
        actions = [(e.action, e.actor) for e in db.session.scalars(db.select(AuditEvent).order_by(AuditEvent.id))]
    assert actions == [("rail_rule_add", "root"), ("rail_rule_add", "root"), ("rail_rule_disable", "root"),
                       ("rail_rule_delete", "root"), ("rail_preset_disable", "root")]
    page = client.get("/admin/safety/").get_data(as_text=True)
    assert "secret sauce" in page and r"code\d{4}" not in page


@pytest.mark.parametrize("kind,value,needle", [
    ("pattern", "[", "Not a valid regular expression"), ("pattern", "(x+x+)+y", "too slow"),
    ("pattern", "a*", "empty string"), ("pattern", "x" * 300, "at most 200"), ("phrase", "   ", "must not be empty"),
    ("other", "x", "Choose a phrase or a pattern"),
])
def test_bad_rules_are_a_400_with_the_reason(rail_app, admin, kind, value, needle):
    client, token = admin
    resp = client.post("/admin/safety/rules", data={"kind": kind, "value": value, "csrf_token": token})
    assert resp.status_code == 400 and needle in resp.get_data(as_text=True)
    with rail_app.app_context():
        assert db.session.query(RailRule).count() == 0


def test_safety_forms_need_the_csrf_token(rail_app, admin):
    client, _ = admin
    assert client.post("/admin/safety/rules", data={"kind": "phrase", "value": "x"}).status_code == 400
    assert client.post("/admin/safety/presets/email", data={"enabled": "0"}).status_code == 400
    with rail_app.app_context():
        assert db.session.query(RailRule).count() == 0


def test_interventions_are_listed_escaped(rail_app, rail_api, admin):
    client, _ = admin
    add_rule(rail_app, "pattern", r"\S")
    rail_api.post(f"/api/conversations/{new_conv(rail_api)}/messages", json={"content": QUESTION, "stream": False})
    with rail_app.app_context():
        row = db.session.scalars(db.select(RailIntervention)).one()
        row.blocked_text = "<script>alert(1)</script>"
        db.session.commit()
    page = client.get("/admin/safety/").get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "pattern: \\S" in page and "refused" in page and "v1-base" in page
