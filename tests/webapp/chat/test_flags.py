"""Flagging an answer as harmful: the API (ownership, CSRF, validation, update in place,
removal, the rate limit), the flag in the conversation payload, training records and feedback
events, the raw export, the admin feedback browser, and the flagged-rate guardrail."""
from __future__ import annotations

import json

import pytest

from rlhf.data.criteria import FLAG_CATEGORIES, FLAG_NOTE_MAX_CHARS, FLAG_VALUES
from tests.support.app import ApiClient, make_app, register_model
from webapp.core.extensions import db
from webapp.core.models import Flag


@pytest.fixture
def conv(api):
    return api.post("/api/conversations", json={}).get_json()["id"]


def ask(api, conv_id, content="How do I cook rice?"):
    resp = api.post(f"/api/conversations/{conv_id}/messages", json={"content": content, "stream": False})
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()


def flag_rows(app) -> list[tuple]:
    with app.app_context():
        return [(f.user_id, f.message_id, f.category, f.note)
                for f in db.session.scalars(db.select(Flag).order_by(Flag.id))]


# ---------------------------------------------------------------------------- API

def test_flag_is_one_row_updated_in_place_and_shown_after_reload(app, api, conv):
    answer = ask(api, conv)["assistant_message"]
    assert answer["flag"] is None
    url = f"/api/messages/{answer['id']}/flag"
    first = api.post(url, json={"category": "harassment", "note": "  It called me stupid.  "})
    assert first.status_code == 200
    body = first.get_json()
    assert body["message_id"] == answer["id"]
    assert (body["flag"]["category"], body["flag"]["label"], body["flag"]["note"]) == \
        ("harassment", dict(FLAG_CATEGORIES)["harassment"], "It called me stupid.")
    second = api.post(url, json={"category": "dangerous"}).get_json()["flag"]
    assert (second["category"], second["note"]) == ("dangerous", None)  # re-flagging replaces category and note
    assert second["created_at"] == body["flag"]["created_at"] and second["updated_at"] >= body["flag"]["updated_at"]
    assert flag_rows(app) == [(api.user_id, answer["id"], "dangerous", None)]
    messages = api.get(f"/api/conversations/{conv}").get_json()["messages"]
    shown = {m["id"]: m["flag"] for m in messages}
    assert shown[answer["id"]]["category"] == "dangerous"
    assert shown[messages[0]["id"]] is None  # the question carries no flag


def test_flag_can_be_removed(app, api, conv):
    answer_id = ask(api, conv)["assistant_message"]["id"]
    url = f"/api/messages/{answer_id}/flag"
    api.post(url, json={"category": "hate", "note": "slur"})
    resp = api.delete(url)
    assert resp.status_code == 200 and resp.get_json() == {"flag": None, "message_id": answer_id, "removed": True}
    assert flag_rows(app) == []
    again = api.delete(url)  # removing no flag is not an error
    assert again.status_code == 200 and again.get_json()["removed"] is False
    assert api.get(f"/api/conversations/{conv}").get_json()["messages"][1]["flag"] is None


@pytest.mark.parametrize("body,needles", [
    ({"category": "spam"}, ["Unknown flag category", "'spam'", *FLAG_VALUES]),
    ({"category": 3}, ["Unknown flag category", "harassment"]),
    ({"category": ["hate"]}, ["Unknown flag category"]),
    ({}, ["'category' is required", "harassment"]),
    ({"note": "only a note"}, ["'category' is required"]),
    ({"category": "hate", "note": "x" * (FLAG_NOTE_MAX_CHARS + 1)}, ["'note' is too long", str(FLAG_NOTE_MAX_CHARS)]),
    ({"category": "hate", "note": 5}, ["'note' must be a string"]),
    ({"category": "hate", "note": "a\x00b"}, ["NUL"]),
    ({"category": "hate", "severity": 3}, ["Unknown field", "severity"]),
    ([1, 2], ["JSON object"]),
])
def test_invalid_flag_is_400_and_changes_nothing(app, api, conv, body, needles):
    answer_id = ask(api, conv)["assistant_message"]["id"]
    api.post(f"/api/messages/{answer_id}/flag", json={"category": "other", "note": "kept"})
    resp = api.post(f"/api/messages/{answer_id}/flag", json=body)
    assert resp.status_code == 400 and resp.is_json
    for needle in needles:
        assert needle in resp.get_json()["error"]
    assert flag_rows(app) == [(api.user_id, answer_id, "other", "kept")]


def test_a_note_at_the_limit_is_accepted_and_an_empty_note_is_none(app, api, conv):
    answer_id = ask(api, conv)["assistant_message"]["id"]
    url = f"/api/messages/{answer_id}/flag"
    assert api.post(url, json={"category": "other", "note": "n" * FLAG_NOTE_MAX_CHARS}).status_code == 200
    assert api.post(url, json={"category": "other", "note": "   "}).get_json()["flag"]["note"] is None


def test_only_answers_the_caller_can_see_can_be_flagged(app, api, conv):
    result = ask(api, conv)
    question, answer = result["user_message"]["id"], result["assistant_message"]["id"]
    resp = api.post(f"/api/messages/{question}/flag", json={"category": "hate"})
    assert resp.status_code == 400 and "assistant answers" in resp.get_json()["error"]
    assert api.delete(f"/api/messages/{question}/flag").status_code == 400
    assert api.post("/api/messages/99999/flag", json={"category": "hate"}).status_code == 404
    other = ApiClient(app.test_client())  # another visitor: 404, as if the answer did not exist
    for resp in (other.post(f"/api/messages/{answer}/flag", json={"category": "hate"}),
                 other.delete(f"/api/messages/{answer}/flag")):
        assert resp.status_code == 404 and resp.get_json()["error"] == "Message not found."
    api.post(f"/api/messages/{answer}/flag", json={"category": "hate"})
    assert other.delete(f"/api/messages/{answer}/flag").status_code == 404
    api.delete(f"/api/conversations/{conv}")  # a deleted conversation's answers are gone too
    assert api.post(f"/api/messages/{answer}/flag", json={"category": "other"}).status_code == 404
    assert flag_rows(app) == [(api.user_id, answer, "hate", None)]


def test_flag_needs_the_csrf_token(app, api, conv):
    answer_id = ask(api, conv)["assistant_message"]["id"]
    url = f"/api/messages/{answer_id}/flag"
    resp = api.client.post(url, json={"category": "hate"})  # no X-CSRFToken header
    assert resp.status_code == 400 and "CSRF" in resp.get_json()["error"]
    api.post(url, json={"category": "hate"})
    forged = api.client.delete(url, headers={"X-CSRFToken": "forged"})
    assert forged.status_code == 400 and "CSRF" in forged.get_json()["error"]
    assert flag_rows(app) == [(api.user_id, answer_id, "hate", None)]


def test_flags_count_against_the_feedback_rate_limit(tmp_path, micro_model_dir):
    app = make_app(tmp_path / "instance", RLHF_MAX_NEW_TOKENS=4, RLHF_FEEDBACK_RATE_LIMIT="3 per minute")
    register_model(app, micro_model_dir)
    alice = ApiClient(app.test_client())
    conv_id = alice.post("/api/conversations", json={}).get_json()["id"]
    answer = ask(alice, conv_id)["assistant_message"]["id"]
    assert alice.post(f"/api/messages/{answer}/feedback", json={"thumb": "down"}).status_code == 200
    assert alice.post(f"/api/messages/{answer}/flag", json={"category": "hate"}).status_code == 200
    assert alice.delete(f"/api/messages/{answer}/flag").status_code == 200
    refused = alice.post(f"/api/messages/{answer}/flag", json={"category": "hate"})
    assert refused.status_code == 429 and "Too many feedback requests" in refused.get_json()["error"]
    assert flag_rows(app) == []
    with app.app_context():
        db.session.remove()
        db.engine.dispose()


# ---------------------------------------------------------------------------- training records, events, export

def test_flag_reaches_feedback_records_and_counts_as_one_event_per_answer(app, api, conv):
    from webapp.training.records import events_per_user, feedback_events, feedback_records

    rated = ask(api, conv)["assistant_message"]["id"]
    flagged_only = ask(api, conv, "And pasta?")["assistant_message"]["id"]
    both = ask(api, conv, "And noodles?")["assistant_message"]["id"]
    api.post(f"/api/messages/{rated}/feedback", json={"thumb": "up"})
    api.post(f"/api/messages/{flagged_only}/flag", json={"category": "self_harm", "note": "call me at 555-123-4567"})
    api.post(f"/api/messages/{both}/feedback", json={"thumb": "down", "reasons": ["rude"]})
    api.post(f"/api/messages/{both}/flag", json={"category": "harassment"})
    with app.app_context():
        [record] = feedback_records()
        fb = {m.id: m.feedback for m in record.messages}
        assert fb[rated].flag is None and fb[rated].thumb == "up"
        # flagged without other feedback: a record all the same, carrying the flag
        assert fb[flagged_only] is not None and fb[flagged_only].flag == "self_harm" and fb[flagged_only].thumb is None
        assert (fb[both].thumb, fb[both].reasons, fb[both].flag) == ("down", ("rude",), "harassment")
        events = feedback_events()
        # three answers (one rated and flagged: one event), no votes
        assert (events["rated_answers"], events["thumbs"], events["flags"], events["total"]) == (3, 2, 2, 3)
        per_user = dict(db.session.execute(db.select(events_per_user())).all())
        assert per_user == {api.user_id: 3}
    api.delete(f"/api/messages/{flagged_only}/flag")
    with app.app_context():
        assert feedback_events()["total"] == 2
        [record] = feedback_records()
        assert {m.id: m.feedback for m in record.messages}.get(flagged_only) is None


def test_a_flag_alone_is_a_new_event_for_the_scheduler(app, api, conv):
    from webapp.core.models import utcnow
    from webapp.training.records import feedback_events

    answer = ask(api, conv)["assistant_message"]["id"]
    api.post(f"/api/messages/{answer}/feedback", json={"thumb": "up"})
    with app.app_context():
        since = utcnow()
        assert feedback_events(since)["total"] == 0
    api.post(f"/api/messages/{answer}/flag", json={"category": "other"})
    with app.app_context():
        assert feedback_events(since)["total"] == 1 and feedback_events()["total"] == 1


def test_raw_export_has_the_flag_category_and_note_redacted(app, api, conv):
    from webapp.training.records import export_rows

    flagged = ask(api, conv)["assistant_message"]["id"]
    rated = ask(api, conv, "And pasta?")["assistant_message"]["id"]
    api.post(f"/api/messages/{flagged}/flag", json={"category": "personal_data", "note": "It showed bob@example.com"})
    api.post(f"/api/messages/{rated}/feedback", json={"thumb": "up"})
    with app.app_context():
        [row] = export_rows("raw")
        fb = {m["id"]: m["feedback"] for m in row["messages"]}
        assert (fb[flagged]["flag"], fb[flagged]["flag_note"]) == ("personal_data", "It showed [EMAIL]")
        assert (fb[rated]["flag"], fb[rated]["flag_note"]) == (None, None)
        for fmt in ("pairs", "kto", "sft"):  # a flag-only record does not trip the training formats
            assert isinstance(export_rows(fmt), list)
        [plain] = export_rows("raw", redact=False)
        assert {m["id"]: m["feedback"] for m in plain["messages"]}[flagged]["flag_note"] == "It showed bob@example.com"
    admin_export = app.test_client().get("/api/admin/export?format=raw")
    # the admin export is the same rows (tests/webapp/admin/test_admin_accounts.py covers it)
    assert admin_export.status_code == 401


# ---------------------------------------------------------------------------- admin feedback browser

@pytest.fixture
def admin(app):
    from webapp.admin.auth import set_admin_password

    with app.app_context():
        set_admin_password("root", "flags-admin-pass")
    client = app.test_client()
    page = client.get("/admin/login").get_data(as_text=True)
    import re
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    resp = client.post("/admin/login", data={"username": "root", "password": "flags-admin-pass", "csrf_token": token})
    assert resp.status_code == 302
    return client


def test_admin_feedback_browser_shows_and_filters_flags(app, api, conv, admin):
    flagged = ask(api, conv)["assistant_message"]["id"]
    rated = ask(api, conv, "And pasta?")["assistant_message"]["id"]
    both = ask(api, conv, "And noodles?")["assistant_message"]["id"]
    api.post(f"/api/messages/{flagged}/flag", json={"category": "violence", "note": "<b>threat</b> & more"})
    api.post(f"/api/messages/{rated}/feedback", json={"thumb": "up"})
    api.post(f"/api/messages/{both}/feedback", json={"thumb": "down"})
    api.post(f"/api/messages/{both}/flag", json={"category": "hate"})

    everything = admin.get("/api/admin/feedback").get_json()
    assert everything["total"] == 3  # a flag without other feedback is listed too
    items = {i["message_id"]: i for i in everything["items"]}
    assert items[flagged]["flag"]["category"] == "violence" and items[flagged]["flag"]["note"] == "<b>threat</b> & more"
    assert items[flagged]["thumb"] is None and items[rated]["flag"] is None
    assert {i["message_id"] for i in admin.get("/api/admin/feedback?flag=any").get_json()["items"]} == {flagged, both}
    assert [i["message_id"] for i in admin.get("/api/admin/feedback?flag=hate").get_json()["items"]] == [both]
    assert [i["message_id"] for i in admin.get("/api/admin/feedback?flag=any&thumb=down").get_json()["items"]] == [both]
    assert [i["message_id"] for i in admin.get("/api/admin/feedback?q=threat").get_json()["items"]] == [flagged]
    bad = admin.get("/api/admin/feedback?flag=spam")
    assert bad.status_code == 400 and "flag must be one of" in bad.get_json()["error"]

    html = admin.get("/admin/feedback?flag=violence").get_data(as_text=True)
    assert dict(FLAG_CATEGORIES)["violence"] in html
    assert "&lt;b&gt;threat&lt;/b&gt; &amp; more" in html and "<b>threat</b>" not in html  # the note is escaped
    assert f'data-message-id="{rated}"' not in html and f'data-message-id="{flagged}"' in html
    assert '<option value="violence" selected>' in html
    assert admin.get("/admin/feedback?flag=nope").status_code == 400


# ---------------------------------------------------------------------------- the flagged-rate guardrail

def _users(arm: str, n: int, ups: tuple[int, ...], flags: tuple[int, ...], answers: int = 4) -> list[dict]:
    """``n`` users of ``arm``, each with ``answers`` thumbed answers; user i gives
    ``ups[i % len(ups)]`` thumbs up and flags ``flags[i % len(flags)]`` of them."""
    return [{"arm": arm, "answers": answers, "thumbs": answers, "ups": ups[i % len(ups)],
             "flags": flags[i % len(flags)]} for i in range(n)]


def test_flagged_rate_is_a_lower_is_better_metric_in_the_table():
    from webapp.core.metric_catalog import METRIC_NAMES, METRICS
    from webapp.experiments.promotion import GUARDRAILS, PromotionPolicy
    from webapp.experiments.table import metrics_table, user_table

    assert "flagged_rate" in METRIC_NAMES and "flagged_rate" in GUARDRAILS
    spec = next(m for m in METRICS if m[0] == "flagged_rate")
    assert spec[3] is False and spec[4:] == ("flags", "answers")
    users = user_table([{"arm": "control", "answers": 4, "flags": 1}, {"arm": "control", "answers": 2, "flags": 0},
                        {"arm": "variant", "answers": 4, "flags": 2}, {"arm": "variant", "answers": 1, "flags": 1}])
    table = metrics_table(users, 0.5, 1, PromotionPolicy())
    row = next(r for r in table["metrics"] if r["name"] == "flagged_rate")
    assert row["higher_is_better"] is False
    # user-capped: each user weighs one observation, so the arm's value is the mean of user rates
    assert row["control"]["value"] == pytest.approx((1 / 4 + 0) / 2)
    assert row["variant"]["value"] == pytest.approx((2 / 4 + 1) / 2)




def test_a_variant_with_more_flags_is_never_promoted_even_with_better_thumbs():
    from webapp.experiments.promotion import PromotionPolicy, decide
    from webapp.experiments.table import metrics_table, user_table

    policy = PromotionPolicy()
    n = 400
    better_thumbs_same_flags = user_table(_users("control", n, (1, 3), (0,)) + _users("variant", n, (2, 4), (0,)))
    table = metrics_table(better_thumbs_same_flags, 0.5, 20, policy)
    assert decide(table, policy, 1.0).action == "promote"  # the baseline: thumbs alone promote it

    more_flags = user_table(_users("control", n, (1, 3), (0,)) + _users("variant", n, (2, 4), (1, 3)))
    table = metrics_table(more_flags, 0.5, 20, policy)
    rows = {r["name"]: r for r in table["metrics"]}
    assert rows["thumbs_up_rate"]["sequential"]["low"] > 0  # thumbs clearly better
    assert rows["flagged_rate"]["sequential"]["low"] > 0  # and clearly more answers flagged
    decision = decide(table, policy, 1.0)
    assert decision.action == "retire" and decision.numbers["guardrails_worse"] == ["flagged_rate"]

    # a little more flagging, not significant yet but a loss of 5 points not ruled out: wait, no promotion
    # (40 users an arm: every variant user thumbs up all four, its users flag 1 in 4 answers, the control's 1 in 8)
    few = user_table(_users("control", 40, (1, 3), (0, 1)) + _users("variant", 40, (4,), (0, 2)))
    table = metrics_table(few, 0.5, 20, policy)
    decision = decide(table, policy, 1.0)
    assert decision.action == "wait" and "flagged_rate" in decision.numbers.get("guardrails_unsafe", [])
    assert decide(table, policy, policy.max_hours).action == "retire"  # and never promoted at the end


def test_experiment_metrics_count_each_users_flags_on_their_served_answers(app, api, conv):
    from webapp.core.models import Experiment, Message, ModelVersion
    from webapp.experiments.metrics import experiment_metrics

    with app.app_context():
        base = db.session.get(ModelVersion, 1)
        variant = ModelVersion(name="v2", path=base.path, kind="ppo", status="candidate", parent_id=base.id)
        db.session.add(variant)
        db.session.commit()
        exp = Experiment(key="flags", control_version_id=base.id, variant_version_id=variant.id, traffic_split=0.5,
                         status="running")
        db.session.add(exp)
        db.session.commit()
        exp_id = exp.id
    answers = [ask(api, conv, q)["assistant_message"]["id"] for q in ("Rice?", "Pasta?", "Noodles?", "Bread?")]
    api.post(f"/api/messages/{answers[0]}/flag", json={"category": "other"})
    other = ApiClient(app.test_client())
    other_conv = other.post("/api/conversations", json={}).get_json()["id"]
    ask(other, other_conv)
    with app.app_context():
        (mine,) = {m.arm for m in db.session.scalars(db.select(Message).where(Message.id.in_(answers)))}
        (theirs,) = {m.arm for m in db.session.scalars(db.select(Message).where(
            Message.role == "assistant", Message.id.not_in(answers)))}
        data = experiment_metrics(db.session.get(Experiment, exp_id))
        row = next(r for r in data["metrics"] if r["name"] == "flagged_rate")
        # each user's own rate (1/4 and 0), capped at one observation each: the mean over users
        if mine == theirs:
            assert row[mine]["value"] == pytest.approx(1 / 8) and row[mine]["n"] == 2, json.dumps(row)
        else:
            assert row[mine]["value"] == pytest.approx(1 / 4) and row[theirs]["value"] == 0, json.dumps(row)
