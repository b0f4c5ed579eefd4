"""Open WebUI's ratings: the recorded export (tests/fixtures/open_webui_export.json, made from the
shape Open WebUI's admin export writes) imported against answers stored as the /v1 API stores
them -- the right counts, the right values, and twice with no change."""
from __future__ import annotations

import copy
import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.app import DATABASES, database_url_for, flask_cli, make_app
from tests.support.paths import FIXTURES
from webapp.core.extensions import db
from webapp.core.models import ApiKey, AuditEvent, Comparison, Conversation, Feedback, Message, User, utcnow
from webapp.training.openwebui import api_user_anon_id, import_ratings
from webapp.training.openwebui_export import load_export
from webapp.training.records import feedback_events

EXPORT = FIXTURES / "open_webui_export.json"

Q1 = "How do I keep basil alive on a windowsill?"
A1 = "Water it when the top of the soil is dry and give it six hours of sun."
Q2, A2 = "What is a good warm-up before a run?", "Walk briskly for five minutes, then do leg swings and easy strides."
Q3, A3 = "How can I fall asleep faster?", "Keep the same bedtime every night and put the phone away an hour before."
Q4 = "How do I start saving money?"
A4A, A4B = "Pay yourself first: move a fixed share of every pay cheque into savings.", "Money is hard. Good luck!"
Q5, A5 = "How long should I boil an egg?", "Nine minutes for a firm yolk, then cool it in cold water."


@pytest.fixture(params=DATABASES)
def database_url(request):
    return database_url_for(request, request.param)


def _answer(conv: Conversation, question: str, answer: str, key: ApiKey | None, message_id: str | None = None,
            parent: Message | None = None) -> Message:
    """A question and its answer as a /v1 completion stores them (a web-chat answer: ``key`` None)."""
    if parent is None:
        parent = Message(conversation_id=conv.id, role="user", content=question)
        db.session.add(parent)
        db.session.flush()
    msg = Message(conversation_id=conv.id, role="assistant", content=answer, parent_id=parent.id,
                  api_key_id=key.id if key else None, external_message_id=message_id,
                  completion_id=f"chatcmpl-{uuid.uuid4().hex}" if key else None)
    db.session.add(msg)
    db.session.flush()
    return msg


def store_answers(app) -> dict[str, int]:
    """The answers the export's ratings are about, by name -> message id."""
    with app.app_context():
        owui = ApiKey(name="open-webui", client="open-webui", prefix="rlhf-abc", key_hash="a" * 64,
                      forwards_user_headers=True)
        other = ApiKey(name="librechat", client="librechat", prefix="rlhf-def", key_hash="b" * 64)
        db.session.add_all([owui, other])
        users = {name: User(anon_id=api_user_anon_id(client, ext)) for name, client, ext in
                 (("alice", "open-webui", "owui-user-alice"), ("bob", "open-webui", "owui-user-bob"),
                  ("dave", "librechat", "dave@example.org"))}
        users["visitor"] = User(anon_id="web-visitor")
        db.session.add_all(users.values())
        db.session.flush()

        def conv(user: str, chat_id: str | None = None) -> Conversation:
            c = Conversation(user_id=users[user].id, title="t", external_chat_id=chat_id)
            db.session.add(c)
            db.session.flush()
            return c

        ids = {"a1": _answer(conv("alice", "chat-1111"), Q1, A1, owui, "msg-a1"),
               "a2": _answer(conv("alice", "chat-2222"), Q2, A2, owui),  # no message-id header
               "a3": _answer(conv("bob"), Q3, A3, owui)}  # no chat-id header either
        c4 = conv("bob", "chat-4444")
        ids["a4a"] = _answer(c4, Q4, A4A, owui, "msg-4a")
        ids["a4b"] = _answer(c4, Q4, A4B, owui, "msg-4b")  # arena: the other model's request, its own question row
        ids["a5_dave"] = _answer(conv("dave"), Q5, A5, other)
        ids["a5_bob"] = _answer(conv("bob"), Q5, A5, owui)
        ids["a3_web"] = _answer(conv("visitor"), Q3, A3, None)  # the same text in the web chat: not a /v1 answer
        db.session.commit()
        return {name: m.id for name, m in ids.items()}


def records() -> list:
    return load_export(EXPORT.read_bytes())


def snapshot(app) -> dict:
    """Every feedback row and comparison, the audit log's length and the feedback events."""
    with app.app_context():
        fb = {(f.user_id, f.message_id): (f.thumb, f.rating, f.comment, tuple(f.reasons or ()), f.updated_at)
              for f in db.session.scalars(db.select(Feedback))}
        votes = [(c.user_id, c.prompt_message_id, c.message_a_id, c.message_b_id, c.winner, c.voted_at)
                 for c in db.session.scalars(db.select(Comparison).order_by(Comparison.id))]
        audits = db.session.scalar(db.select(db.func.count(AuditEvent.id)))
        return {"feedback": fb, "votes": votes, "audits": audits, "events": feedback_events()}


@pytest.fixture
def app(tmp_path, database_url):
    overrides = {"SQLALCHEMY_DATABASE_URI": database_url} if database_url else {}
    application = make_app(tmp_path / "instance", **overrides)
    yield application
    with application.app_context():
        db.session.remove()
        db.engine.dispose()


def test_the_recorded_export_imports_with_the_right_counts_and_twice_with_no_change(app):
    ids = store_answers(app)
    with app.app_context():
        summary = import_ratings(records(), source=str(EXPORT))
    assert {k: summary[k] for k in ("records", "matched", "duplicate", "unmatched")} == \
        {"records": 14, "matched": 5, "duplicate": 2, "unmatched": 7}
    assert summary["unmatched_by_reason"] == {"no such chat": 1, "message not found": 1,
                                              "not the rater's answer": 1, "not a rating": 1, "malformed": 3}
    assert summary["matched_by"] == {"message id": 2, "text": 3}
    assert summary["feedback"] == {"created": 5, "updated": 0, "unchanged": 0, "kept": 0}
    assert summary["comparisons"] == {"created": 1, "updated": 0, "unchanged": 0, "kept": 0}
    outcome = {r["id"] if isinstance(r["id"], str) else f"#{r['record']}": (r["status"], r.get("reason"))
               for r in summary["results"] if not (r["id"] == "fb-ids" and r["status"] == "duplicate")}
    assert outcome == {
        "fb-ids": ("matched", None), "fb-text-chat": ("matched", None), "fb-text-chat-older": ("duplicate", None),
        "fb-text-global": ("matched", None), "fb-arena": ("matched", None),
        # Carol's record has the text of Dave's and Bob's answers, neither of which she was served
        "fb-ambiguous": ("unmatched", "not the rater's answer"), "fb-narrowed": ("matched", None),
        "fb-missing": ("unmatched", "message not found"), "fb-no-chat": ("unmatched", "no such chat"),
        "fb-other-type": ("unmatched", "not a rating"), "fb-bad-rating": ("unmatched", "malformed"),
        "#12": ("unmatched", "malformed"), "fb-no-meta": ("unmatched", "malformed")}
    assert summary["results"][13]["status"] == "duplicate"  # the first record again
    by_id = {r["id"]: r for r in summary["results"] if isinstance(r["id"], str) and r["status"] != "duplicate"}
    assert by_id["fb-ids"]["message_id"] == ids["a1"] and by_id["fb-ids"]["matched_by"] == "message id"
    assert by_id["fb-text-global"]["message_id"] == ids["a3"]  # not the web chat's answer with the same text
    assert by_id["fb-narrowed"]["message_id"] == ids["a5_bob"]  # Bob's own of the two equal answers
    assert by_id["fb-arena"]["siblings_matched"] == 1

    with app.app_context():
        owner = {m.id: m.conversation.user_id for m in db.session.scalars(db.select(Message))}
        fb = {f.message_id: f for f in db.session.scalars(db.select(Feedback))}
        assert set(fb) == {ids[k] for k in ("a1", "a2", "a3", "a4a", "a5_bob")}
        assert all(f.user_id == owner[f.message_id] for f in fb.values())  # the answer's owner rated it
        got = {k: (fb[ids[k]].thumb, fb[ids[k]].rating, fb[ids[k]].comment, fb[ids[k]].reasons)
               for k in ("a1", "a2", "a3", "a4a", "a5_bob")}
        assert got == {"a1": ("up", 4, "Clear and short.", ["accurate"]),  # 8/10 -> 4 stars
                       "a2": ("down", None, None, ["wrong"]),  # the newer of two records; an old label's chip
                       "a3": ("up", None, "Nice.\nReason: Showcased creativity", []),
                       "a4a": ("up", 5, None, []),
                       "a5_bob": ("down", 2, None, ["too long"])}
        vote = db.session.scalars(db.select(Comparison)).one()
        a4a = db.session.get(Message, ids["a4a"])
        assert (vote.user_id, vote.prompt_message_id, vote.message_a_id, vote.message_b_id, vote.winner) == \
            (owner[ids["a4a"]], a4a.parent_id, ids["a4a"], ids["a4b"], "a")
        assert feedback_events()["total"] == 6  # five rated answers and one vote

    before = snapshot(app)
    with app.app_context():
        again = import_ratings(records(), source=str(EXPORT))
    assert {k: again[k] for k in ("records", "matched", "duplicate", "unmatched")} == \
        {"records": 14, "matched": 5, "duplicate": 2, "unmatched": 7}
    assert again["feedback"] == {"created": 0, "updated": 0, "unchanged": 5, "kept": 0}
    assert again["comparisons"] == {"created": 0, "updated": 0, "unchanged": 1, "kept": 0}
    assert snapshot(app) == before  # no value, no updated_at, no vote, no audit entry, no event changed


def test_newer_feedback_wins_whichever_side_wrote_it(app):
    """A rating changed in the app after the import is kept; one changed in Open WebUI later is taken."""
    ids = store_answers(app)
    with app.app_context():
        import_ratings(records())
        alice = db.session.get(Message, ids["a1"]).conversation.user_id
        from webapp.core.ratings.store import save_feedback

        save_feedback(alice, ids["a1"], {"thumb": "down"})  # now, after the record's time
        assert import_ratings(records())["feedback"] == {"created": 0, "updated": 0, "unchanged": 4, "kept": 1}
        assert db.session.scalars(db.select(Feedback).filter_by(message_id=ids["a1"])).one().thumb == "down"

        changed = records()
        for raw in (changed[0], changed[-1]):  # the user re-rated in Open WebUI after that: thumbs up again
            raw["updated_at"] = int(utcnow().timestamp()) + 60  # later (within the allowed clock skew)
        assert import_ratings(changed)["feedback"]["updated"] == 1
        assert db.session.scalars(db.select(Feedback).filter_by(message_id=ids["a1"])).one().thumb == "up"

        flipped = copy.deepcopy(changed)  # the arena answer now thumbs down: the sibling wins the vote
        flipped[4]["data"]["rating"] = -1
        flipped[4]["updated_at"] = int(utcnow().timestamp()) + 60
        summary = import_ratings(flipped)
        assert summary["comparisons"] == {"created": 0, "updated": 1, "unchanged": 0, "kept": 0}
        assert db.session.scalars(db.select(Comparison)).one().winner == "b"


def test_sibling_ratings_of_both_answers_make_one_vote(app):
    """Both arena answers rated (Open WebUI lists each as the other's sibling): one vote, a tie when both
    are liked."""
    ids = store_answers(app)
    arena = records()[4]
    other = copy.deepcopy(arena)
    other["id"], other["meta"]["message_id"] = "fb-arena-b", "msg-4b"
    with app.app_context():
        summary = import_ratings([arena, other])
        assert summary["comparisons"]["created"] == 1
        vote = db.session.scalars(db.select(Comparison)).one()
        assert {vote.message_a_id, vote.message_b_id} == {ids["a4a"], ids["a4b"]} and vote.winner == "tie"


def test_cli_counts_json_and_one_line_errors(app, tmp_path, monkeypatch):
    store_answers(app)
    monkeypatch.setenv("RLHF_INSTANCE_DIR", app.config["INSTANCE_DIR"])
    if app.config["SQLALCHEMY_DATABASE_URI"].startswith("postgresql"):
        monkeypatch.setenv("DATABASE_URL", app.config["SQLALCHEMY_DATABASE_URI"])
    result = flask_cli("import-feedback", "--format", "open-webui", str(EXPORT))
    assert result.exit_code == 0, result.output
    assert "14 records: 5 matched, 2 duplicate, 7 unmatched" in result.output
    assert "feedback: 5 created, 0 updated, 0 unchanged" in result.output
    assert ("unmatched: no such chat 1, message not found 1, not the rater's answer 1, not a rating 1, malformed 3"
            in result.output)
    assert "record 9 (id fb-no-chat): no such chat: chat chat-9999 is not stored" in result.output

    result = flask_cli("import-feedback", "--format", "open-webui", "--json", str(EXPORT))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["feedback"] == {"created": 0, "updated": 0, "unchanged": 5, "kept": 0}
    assert [r["status"] for r in data["results"]].count("matched") == 5

    for content, problem in (("Feedback,rating\n1,up\n", "is not JSON"),
                             ('{"id": "fb-1"}', "expected a JSON list of feedback records, got a JSON dict")):
        bad = tmp_path / "export.csv"
        bad.write_text(content)
        result = flask_cli("import-feedback", "--format", "open-webui", str(bad))
        assert result.exit_code == 1
        assert result.output.count("\n") == 1 and result.output.startswith("Error: ") and problem in result.output
    result = flask_cli("import-feedback", "--format", "open-webui", str(tmp_path / "missing.json"))
    assert result.exit_code == 1 and "cannot read" in result.output


def test_malformed_records_are_reported_not_raised(app):
    """Whatever a record holds, the import goes on and says what was wrong with it."""
    store_answers(app)
    base = records()[0]
    odd = [None, 7, [], {}, {"id": ""}, {"id": "x"}, {"id": "x2", "type": "rating"},
           {**base, "id": "m1", "data": "up"}, {**base, "id": "m2", "data": {**base["data"], "rating": True}},
           {**base, "id": "m3", "data": {**base["data"], "details": {"rating": 11}}},
           {**base, "id": "m4", "data": {**base["data"], "comment": {"text": "x"}}},
           {**base, "id": "m5", "data": {**base["data"], "comment": "nul\x00"}},
           {**base, "id": "m6", "updated_at": "yesterday", "created_at": None},
           {**base, "id": "m7", "snapshot": "chat"}, {**base, "id": "m8", "meta": {"chat_id": 5, "message_id": "x"}}]
    with app.app_context():
        summary = import_ratings(odd)
    assert summary["unmatched"] == len(odd) and summary["unmatched_by_reason"] == {"malformed": len(odd)}
    assert all(r["detail"] for r in summary["results"])


def _as(raw: dict, user: str, **meta) -> dict:
    """``raw`` as another Open WebUI user's record (a new feedback id), with ``meta`` changed."""
    forged = copy.deepcopy(raw)
    forged["id"], forged["user_id"] = f"fb-{user}-{len(meta)}-{uuid.uuid4().hex[:6]}", user
    forged["meta"].update(meta)
    return forged


def test_a_rating_binds_to_its_rater_never_to_whoever_got_the_answer(app):
    """Open WebUI's ``meta`` and ``snapshot`` come from the rater's browser: a record that names another
    person's chat, message or answer text is reported, and nobody's feedback is written for it. (Before,
    each of these became Alice's or Bob's feedback.)"""
    ids = store_answers(app)
    base = records()
    alice_ids, alice_text, bob_arena = base[0], base[1], base[4]
    forged = [
        _as(alice_ids, "owui-user-mallory"),  # Alice's chat and message ids, Alice's text
        _as(alice_text, "owui-user-mallory", chat_id="chat-never-stored"),  # her answer's text alone
        _as(alice_text, "owui-user-bob"),  # Bob rates Alice's answer by its text in her chat
        _as(bob_arena, "owui-user-alice"),  # and Alice Bob's arena answer
        _as(alice_ids, "key:1"),  # an id shaped like the key's own user
        {**{k: v for k, v in _as(alice_ids, "x").items() if k != "user"}, "user_id": None},  # no user at all
    ]
    with app.app_context():
        summary = import_ratings(forged)
        assert summary["matched"] == 0, summary["results"]
        assert summary["unmatched_by_reason"] == {"not the rater's answer": len(forged)}
        assert "served to someone else, not to Open WebUI user owui-user-mallory" in summary["results"][0]["detail"]
        assert db.session.scalar(db.select(db.func.count(Feedback.id))) == 0
        assert db.session.scalar(db.select(db.func.count(Comparison.id))) == 0

        # the owners' own records still match, beside the forged ones
        summary = import_ratings(forged + [alice_ids, bob_arena])
        assert summary["matched"] == 2 and summary["unmatched"] == len(forged)
        rated = {f.message_id: f.user_id for f in db.session.scalars(db.select(Feedback))}
        owner = {m.id: m.conversation.user_id for m in db.session.scalars(db.select(Message))}
        assert rated == {ids["a1"]: owner[ids["a1"]], ids["a4a"]: owner[ids["a4a"]]}


def test_a_time_from_the_future_never_outranks_the_owners_own_feedback(app):
    """A record dated next year used to overwrite the owner's later rating on every import."""
    ids = store_answers(app)
    with app.app_context():
        import_ratings(records())
        alice = db.session.get(Message, ids["a1"]).conversation.user_id
        from webapp.core.ratings.store import save_feedback

        save_feedback(alice, ids["a1"], {"thumb": "down"})  # Alice changes her mind in the app
        future = records()[0]
        future["updated_at"] = int(utcnow().timestamp()) + 365 * 86400
        for _ in range(2):
            summary = import_ratings([future])
            assert summary["results"][0]["status"] == "unmatched"
            assert summary["results"][0]["reason"] == "malformed"
            assert "in the future" in summary["results"][0]["detail"]
            assert db.session.scalars(db.select(Feedback).filter_by(message_id=ids["a1"])).one().thumb == "down"
        future["updated_at"] = int(utcnow().timestamp()) + 30  # a clock a little ahead: still a rating
        assert import_ratings([future])["results"][0]["status"] == "matched"


def test_a_record_of_an_unforeseen_shape_is_skipped_and_the_rest_imports(app):
    """A snapshot ``parentId`` that is a list stopped the whole import (TypeError: unhashable type) and,
    through the pull, every later one; the genuine record beside it was lost."""
    ids = store_answers(app)
    base = records()
    odd = copy.deepcopy(base[1])  # matched by text: the snapshot is read
    odd["id"] = "fb-odd"
    messages = odd["snapshot"]["chat"]["chat"]["history"]["messages"]
    rated = messages[odd["meta"]["message_id"]]
    rated["parentId"] = [rated["parentId"]]
    with app.app_context():
        summary = import_ratings([odd, base[0]])
        assert [r["status"] for r in summary["results"]] == ["unmatched", "matched"]
        assert summary["results"][0]["reason"] in ("malformed", "no such chat", "message not found")
        assert db.session.scalars(db.select(Feedback).filter_by(message_id=ids["a1"])).one().thumb == "up"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12),
       st.sampled_from(["id", "user_id", "type", "data", "meta", "snapshot", "updated_at", "parentId", "childrenIds",
                        "rating", "details", "content", "role", "chat_id", "message_id", "sibling_model_ids",
                        # what else Open WebUI 0.12.4 writes in a record (tests/fixtures/open_webui/export.json)
                        "chat", "history", "messages", "currentId", "annotation", "feedbackId", "output", "reason",
                        "comment", "tags", "base_models", "message_index"]),
       st.integers(min_value=0, max_value=6))
def test_any_value_anywhere_in_a_record_is_reported_not_raised(app, value, field, which):
    """Whatever JSON stands in any field at any depth of a real record -- one of Open WebUI 0.12.4's,
    recorded from a live session -- the import reports that record and goes on."""
    recorded = load_export((FIXTURES / "open_webui" / "export.json").read_bytes())
    record = copy.deepcopy(recorded[which % len(recorded)])

    def put(node) -> None:  # the value in every place that field name appears
        if isinstance(node, dict):
            for k in list(node):
                if k == field:
                    node[k] = value
                else:
                    put(node[k])
        elif isinstance(node, list):
            for item in node:
                put(item)

    put(record)
    with app.app_context():
        summary = import_ratings([record, {"id": 1}])
    assert summary["records"] == 2 and all(r.get("status") for r in summary["results"])
