"""Every chat endpoint through the Flask client: happy paths, stored rows, and bad input."""
from __future__ import annotations

import json

import pytest

from tests.support.app import ApiClient, register_model, sse_events
from webapp.core.extensions import db
from webapp.core.models import Assignment, Comparison, Conversation, Experiment, Feedback, Message, ModelVersion


def counts(app) -> dict[str, int]:
    with app.app_context():
        return {m.__tablename__: db.session.query(m).count() for m in (Conversation, Message, Feedback, Comparison)}


@pytest.fixture
def conv(api):
    resp = api.post("/api/conversations", json={})
    assert resp.status_code == 201
    return resp.get_json()["id"]


def ask(api, conv_id, content="How do I cook rice?", **extra):
    resp = api.post(f"/api/conversations/{conv_id}/messages", json={"content": content, "stream": False, **extra})
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()


# ---------------------------------------------------------------------------- conversations

def test_conversation_lifecycle(api):
    first = api.post("/api/conversations", json={}).get_json()
    second = api.post("/api/conversations", json={"title": "Second"}).get_json()
    assert first["title"] == "New chat" and second["title"] == "Second"
    listed = api.get("/api/conversations").get_json()["conversations"]
    assert [c["id"] for c in listed] == [second["id"], first["id"]]  # newest first

    renamed = api.client.patch(f"/api/conversations/{first['id']}", json={"title": "Renamed"},
                               headers={"X-CSRFToken": api.csrf})
    assert renamed.status_code == 200 and renamed.get_json()["title"] == "Renamed"

    assert api.delete(f"/api/conversations/{first['id']}").get_json() == {"id": first["id"], "deleted": True}
    assert [c["id"] for c in api.get("/api/conversations").get_json()["conversations"]] == [second["id"]]
    assert api.get(f"/api/conversations/{first['id']}").status_code == 404
    assert api.delete(f"/api/conversations/{first['id']}").status_code == 404


def test_first_message_titles_the_conversation(api, conv):
    ask(api, conv, "  How do I   bake bread\nat home?  ")
    assert api.get(f"/api/conversations/{conv}").get_json()["title"] == "How do I bake bread at home"
    ask(api, conv, "And rye bread?")  # later questions keep the title
    assert api.get(f"/api/conversations/{conv}").get_json()["title"] == "How do I bake bread at home"
    named = api.post("/api/conversations", json={"title": "My own title?"}).get_json()["id"]
    ask(api, named)  # a title the user chose is kept as written
    assert api.get(f"/api/conversations/{named}").get_json()["title"] == "My own title?"


@pytest.mark.parametrize("question,title", [
    ("How do I cook rice?", "How do I cook rice"),
    ("  why   is\tthe sky\n\nblue?!...  ", "why is the sky blue"),
    ("## How do I **bake** _sourdough_?", "How do I bake sourdough"),
    ("> Explain `__init__.py` and [imports](https://example.com) please.", "Explain __init__.py and imports please"),
    ("- rice\n- beans\n- what else?", "rice beans what else"),
    ("```python\nprint('hi')\n```\nWhy does this fail?", "print('hi') Why does this fail"),
    ("snake_case_names and 2 * 3 * 4?", "snake_case_names and 2 * 3 * 4"),
    ("Tell me everything you know about sourdough starters and how to feed them every day",
     "Tell me everything you know about sourdough\u2026"),
    ("What, exactly, is the difference between baking soda and baking powder, chemically?",
     "What, exactly, is the difference between baking\u2026"),
    ("x" * 80, "x" * 50 + "\u2026"),
    ("???", "???"),
    ("<b>bold</b> question?", "<b>bold</b> question"),
])
def test_title_is_cleaned_from_the_first_question(question, title):
    from webapp.chat.conversations import TITLE_CHARS, clean_title

    assert clean_title(question) == title
    assert len(clean_title(question)) <= TITLE_CHARS + 1


# ---------------------------------------------------------------------------- answering

IDENTITY = {"model_version", "arm", "model_version_id", "experiment_id", "experiment"}  # admins only (blind arms)


def test_streamed_answer_is_stored_with_version_latency_and_tokens(app, api, conv):
    resp = api.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?"})
    assert resp.status_code == 200 and resp.mimetype == "text/event-stream"
    events = sse_events(resp)
    kinds = [e for e, _ in events]
    assert kinds[-1] == "done" and set(kinds[:-1]) <= {"token"}
    done = events[-1][1]
    streamed = "".join(d["text"] for e, d in events if e == "token")
    assert set(done) >= {"user_message_id", "message_id", "finish_reason", "token_count", "latency_ms", "content"}
    assert not IDENTITY & set(done)  # the user is not told which version answered
    with app.app_context():
        question = db.session.get(Message, done["user_message_id"])
        answer = db.session.get(Message, done["message_id"])
        assert (question.role, question.content, question.parent_id) == ("user", "How do I cook rice?", None)
        assert answer.role == "assistant" and answer.parent_id == question.id
        assert answer.content == streamed.strip()
        assert answer.model_version.name == "v1-base"
        assert answer.latency_ms > 0 and 0 < answer.token_count <= app.config["RLHF_MAX_NEW_TOKENS"]


def test_non_streamed_answer_and_history_follow_parents(api, conv):
    first = ask(api, conv)
    second = ask(api, conv, "Thanks. Anything else?")
    assert second["user_message"]["parent_id"] == first["assistant_message"]["id"]
    assert second["assistant_message"]["parent_id"] == second["user_message"]["id"]
    msgs = api.get(f"/api/conversations/{conv}").get_json()["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert all(set(m) == {"id", "role", "content", "parent_id", "latency_ms", "token_count", "created_at", "cut",
                          "feedback", "flag"}
               for m in msgs)


def test_regenerate_makes_siblings_and_replies_can_branch(app, api, conv):
    first = ask(api, conv)
    answer_id = first["assistant_message"]["id"]
    again = api.post(f"/api/messages/{answer_id}/regenerate", json={"stream": False})
    assert again.status_code == 201
    sibling = again.get_json()["assistant_message"]
    assert sibling["parent_id"] == first["user_message"]["id"] and sibling["id"] != answer_id
    streamed = api.post(f"/api/messages/{first['user_message']['id']}/regenerate")  # from the question, streamed
    assert sse_events(streamed)[-1][0] == "done"
    with app.app_context():
        assert db.session.query(Message).filter_by(parent_id=first["user_message"]["id"]).count() == 3
    # reply to the first answer explicitly, not the newest one
    branch = ask(api, conv, "Tell me more", parent_id=answer_id)
    assert branch["user_message"]["parent_id"] == answer_id


def test_edit_and_resend_branches_beside_the_original_question(app, api, conv):
    first = ask(api, conv, "How do I cook rice?")
    follow = ask(api, conv, "And pasta?")
    question = follow["user_message"]
    edited = api.post(f"/api/messages/{question['id']}/edit", json={"content": "  And noodles?  ", "stream": False})
    assert edited.status_code == 201, edited.get_json()
    new_q, new_a = edited.get_json()["user_message"], edited.get_json()["assistant_message"]
    # a sibling of the original question (same parent: the first answer), with its own answer
    assert new_q["id"] != question["id"] and new_q["role"] == "user" and new_q["content"] == "And noodles?"
    assert new_q["parent_id"] == question["parent_id"] == first["assistant_message"]["id"]
    assert new_a["parent_id"] == new_q["id"] and new_a["content"]
    # streamed, on the first question (no parent): a third root-level branch
    events = sse_events(api.post(f"/api/messages/{first['user_message']['id']}/edit",
                                 json={"content": "How do I cook quinoa?"}))
    assert events[-1][0] == "done"
    done = events[-1][1]
    with app.app_context():
        original = db.session.get(Message, question["id"])
        assert original.content == "And pasta?"  # the original and its answer stay as they were
        assert db.session.query(Message).filter_by(parent_id=question["id"]).count() == 1
        siblings = db.session.scalars(db.select(Message.content).filter_by(
            parent_id=first["assistant_message"]["id"], role="user").order_by(Message.id)).all()
        assert siblings == ["And pasta?", "And noodles?"]
        root = db.session.get(Message, done["user_message_id"])
        assert (root.parent_id, root.content, root.role) == (None, "How do I cook quinoa?", "user")
        assert db.session.get(Message, done["message_id"]).parent_id == root.id
    messages = api.get(f"/api/conversations/{conv}").get_json()
    assert messages["title"] == "How do I cook rice"  # editing does not retitle the conversation
    roots = [m["content"] for m in messages["messages"] if m["parent_id"] is None]
    assert roots == ["How do I cook rice?", "How do I cook quinoa?"]
    # a new question without parent_id follows the newest branch
    after = ask(api, conv, "Thanks")
    assert after["user_message"]["parent_id"] == done["message_id"]


@pytest.mark.parametrize("body,needle", [
    ({"content": ""}, "must not be empty"), ({"content": "x" * 4001}, "too long"), ({}, "required"),
    ({"content": 5}, "must be a string"), ({"content": "hi", "stream": 1}, "stream"),
    ({"content": "hi", "parent_id": 1}, "Unknown field"), ([1], "JSON object"),
])
def test_invalid_edit_is_400_and_stores_nothing(app, api, conv, body, needle):
    question = ask(api, conv)["user_message"]["id"]
    before = counts(app)
    resp = api.post(f"/api/messages/{question}/edit", json=body)
    assert resp.status_code == 400 and needle in resp.get_json()["error"]
    assert counts(app) == before


def test_edit_needs_a_question_of_the_caller(app, api, conv):
    exchange = ask(api, conv)
    before = counts(app)
    answer = api.post(f"/api/messages/{exchange['assistant_message']['id']}/edit", json={"content": "hi"})
    assert answer.status_code == 400 and "user message" in answer.get_json()["error"]
    assert api.post("/api/messages/99999/edit", json={"content": "hi"}).status_code == 404
    other = ApiClient(app.test_client())
    resp = other.post(f"/api/messages/{exchange['user_message']['id']}/edit", json={"content": "hi", "stream": False})
    assert resp.status_code == 404 and resp.is_json
    no_csrf = api.client.post(f"/api/messages/{exchange['user_message']['id']}/edit", json={"content": "hi"})
    assert no_csrf.status_code == 400 and "CSRF" in no_csrf.get_json()["error"]
    api.delete(f"/api/conversations/{conv}")
    gone = api.post(f"/api/messages/{exchange['user_message']['id']}/edit", json={"content": "hi"})
    assert gone.status_code == 404
    with app.app_context():
        assert db.session.query(Message).count() == before["messages"]


def test_edit_counts_against_the_chat_rate_limit(tmp_path, micro_model_dir):
    from tests.support.app import make_app

    app = make_app(tmp_path / "instance", RLHF_CHAT_RATE_LIMIT="2 per minute")
    register_model(app, micro_model_dir)
    client = ApiClient(app.test_client())
    conv_id = client.post("/api/conversations", json={}).get_json()["id"]
    question = ask(client, conv_id)["user_message"]["id"]
    assert client.post(f"/api/messages/{question}/edit", json={"content": "Again?", "stream": False}).status_code == 201
    before = counts(app)
    limited = client.post(f"/api/messages/{question}/edit", json={"content": "Once more?", "stream": False})
    assert limited.status_code == 429 and "Too many messages" in limited.get_json()["error"]
    assert limited.headers["Retry-After"]
    assert counts(app) == before
    with app.app_context():
        db.session.remove()
        db.engine.dispose()


def test_default_parent_is_newest_answer(api, conv):
    first = ask(api, conv)
    regen = api.post(f"/api/messages/{first['assistant_message']['id']}/regenerate", json={"stream": False}).get_json()
    follow = ask(api, conv, "And then?")
    assert follow["user_message"]["parent_id"] == regen["assistant_message"]["id"]


def test_streamed_answer_stopped_midway_keeps_what_was_said(app, api, conv):
    resp = api.client.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?"},
                           headers={"X-CSRFToken": api.csrf}, buffered=False)
    chunks = iter(resp.response)
    first = next(chunks).decode()
    resp.close()  # the browser's stop button / a dropped connection
    text = json.loads(first.split("data: ", 1)[1])["text"]
    with app.app_context():
        answers = db.session.query(Message).filter_by(role="assistant").all()
        if text.strip():
            assert [a.content for a in answers] == [text.strip()]
        else:  # nothing was said: the question is taken back too
            assert answers == [] and db.session.query(Message).count() == 0


def test_generation_failure_stores_nothing(app, api, conv):
    ask(api, conv)  # loads the model
    with app.app_context():
        pool = app.extensions["model_pool"]
        model = next(iter(pool._models.values())).model

    def broken_forward(module, args):  # every forward pass fails, as on a GPU out of memory
        raise RuntimeError("CUDA out of memory")

    hook = model.register_forward_pre_hook(broken_forward)
    try:
        before = counts(app)
        events = sse_events(api.post(f"/api/conversations/{conv}/messages", json={"content": "Boom?"}))
        assert events[-1][0] == "error" and "Generation failed" in events[-1][1]["error"]
        resp = api.post(f"/api/conversations/{conv}/messages", json={"content": "Boom?", "stream": False})
        assert resp.status_code == 503 and "failed to answer" in resp.get_json()["error"]
        resp = api.post(f"/api/conversations/{conv}/compare", json={"content": "Boom?"})
        assert resp.status_code == 503
        assert counts(app) == before
    finally:
        hook.remove()


def test_model_that_cannot_load_is_503_and_nothing_written(app, api, conv):
    with app.app_context():
        version = db.session.scalars(db.select(ModelVersion)).one()
        version.path = "/nonexistent/model"
        db.session.commit()
    before = counts(app)
    resp = api.post(f"/api/conversations/{conv}/messages", json={"content": "Hi", "stream": False})
    assert resp.status_code == 503 and "cannot be loaded" in resp.get_json()["error"]
    assert counts(app) == before


# ---------------------------------------------------------------------------- feedback

def test_feedback_is_one_row_updated_in_place(app, api, conv):
    answer_id = ask(api, conv)["assistant_message"]["id"]
    url = f"/api/messages/{answer_id}/feedback"
    assert api.post(url, json={"thumb": "up", "reasons": ["helpful", "helpful", "polite"]}).status_code == 200
    assert api.post(url, json={"rating": 4}).status_code == 200
    assert api.post(url, json={"correction": "  Rinse the rice first.  "}).status_code == 200
    final = api.post(url, json={"comment": "Nice", "thumb": "down", "reasons": ["wrong"]}).get_json()["feedback"]
    assert (final["thumb"], final["rating"], final["correction"], final["comment"], final["reasons"]) == \
        ("down", 4, "Rinse the rice first.", "Nice", ["wrong"])
    cleared = api.post(url, json={"thumb": None, "rating": None, "correction": ""}).get_json()["feedback"]
    assert (cleared["thumb"], cleared["rating"], cleared["correction"], cleared["comment"]) \
        == (None, None, None, "Nice")
    with app.app_context():
        [row] = db.session.query(Feedback).all()
        assert (row.user_id, row.message_id) == (api.user_id, answer_id)
        assert row.updated_at >= row.created_at
    shown = api.get(f"/api/conversations/{conv}").get_json()["messages"][1]["feedback"]
    assert shown["comment"] == "Nice"


@pytest.mark.parametrize("body,needle", [
    ({"rating": 0}, "rating"), ({"rating": 6}, "rating"), ({"rating": "5"}, "rating"), ({"rating": 4.5}, "rating"),
    ({"rating": True}, "rating"), ({"thumb": "sideways"}, "thumb"), ({"thumb": 1}, "thumb"),
    ({"reasons": "rude"}, "reasons"), ({"reasons": ["made-up"]}, "Unknown reason"), ({"reasons": [1]}, "reasons"),
    ({"correction": 5}, "correction"), ({"correction": "x" * 4001}, "too long"), ({"comment": "x" * 2001}, "too long"),
    ({}, "at least one"), ({"stars": 5}, "Unknown field"), ([1, 2], "JSON object"),
])
def test_invalid_feedback_is_400_and_changes_nothing(app, api, conv, body, needle):
    answer_id = ask(api, conv)["assistant_message"]["id"]
    api.post(f"/api/messages/{answer_id}/feedback", json={"thumb": "up"})
    resp = api.post(f"/api/messages/{answer_id}/feedback", json=body)
    assert resp.status_code == 400 and needle in resp.get_json()["error"]
    with app.app_context():
        [row] = db.session.query(Feedback).all()
        assert (row.thumb, row.rating, row.correction) == ("up", None, None)


def test_feedback_needs_an_assistant_message_the_caller_can_see(app, api, conv):
    result = ask(api, conv)
    resp = api.post(f"/api/messages/{result['user_message']['id']}/feedback", json={"thumb": "up"})
    assert resp.status_code == 400 and "assistant" in resp.get_json()["error"]
    assert api.post("/api/messages/99999/feedback", json={"thumb": "up"}).status_code == 404
    raw = api.client.post(f"/api/messages/{result['assistant_message']['id']}/feedback", data="thumb=up",
                          headers={"X-CSRFToken": api.csrf, "Content-Type": "text/plain"})
    assert raw.status_code == 400 and raw.is_json
    assert counts(app)["feedback"] == 0


# ---------------------------------------------------------------------------- compare

def test_compare_and_vote(app, api, conv):
    resp = api.post(f"/api/conversations/{conv}/compare", json={"content": "How can I save money?"})
    assert resp.status_code == 201
    data = resp.get_json()
    assert data["a"]["parent_id"] == data["b"]["parent_id"] == data["user_message"]["id"]
    assert not IDENTITY & (set(data["a"]) | set(data["b"]))  # "A" and "B", nothing more
    vote = api.post(f"/api/pairs/{data['pair_id']}/vote", json={"winner": "b"})
    assert vote.status_code == 200 and vote.get_json()["continue_from"] == data["b"]["id"]
    assert set(vote.get_json()) == {"pair", "continue_from"}  # nor after the vote
    # the chosen answer continues the conversation
    follow = ask(api, conv, "And what next?")
    assert follow["user_message"]["parent_id"] == data["b"]["id"]
    # votes can be changed; the row is updated in place
    assert api.post(f"/api/pairs/{data['pair_id']}/vote", json={"winner": "tie"}).status_code == 200
    with app.app_context():
        [pair] = db.session.query(Comparison).all()
        assert (pair.winner, pair.user_id, pair.message_a_id, pair.message_b_id) == \
            ("tie", api.user_id, data["a"]["id"], data["b"]["id"])
        assert pair.voted_at is not None
    shown = api.get(f"/api/conversations/{conv}").get_json()["comparisons"]
    assert shown == [{"id": data["pair_id"], "prompt_message_id": data["user_message"]["id"], "a": data["a"]["id"],
                      "b": data["b"]["id"], "winner": "tie"}]


def test_compare_on_an_existing_question(api, conv):
    first = ask(api, conv)
    resp = api.post(f"/api/conversations/{conv}/compare", json={"message_id": first["user_message"]["id"]})
    assert resp.status_code == 201
    assert resp.get_json()["a"]["parent_id"] == first["user_message"]["id"]
    bad = api.post(f"/api/conversations/{conv}/compare", json={"message_id": first["assistant_message"]["id"]})
    assert bad.status_code == 400


@pytest.mark.parametrize("winner", ["A", "c", None, 1, ""])
def test_invalid_vote_is_400(api, conv, winner):
    data = api.post(f"/api/conversations/{conv}/compare", json={"content": "Hi"}).get_json()
    resp = api.post(f"/api/pairs/{data['pair_id']}/vote", json={"winner": winner})
    assert resp.status_code == 400 and "winner" in resp.get_json()["error"]


# ---------------------------------------------------------------------------- bad input & isolation

@pytest.mark.parametrize("body,needle", [
    ({"content": ""}, "must not be empty"), ({"content": "   \n "}, "must not be empty"),
    ({"content": "x" * 4001}, "too long"), ({"content": 42}, "must be a string"), ({}, "required"),
    ({"content": "hi", "stream": "yes"}, "stream"), ({"content": "hi", "parent_id": "7"}, "parent_id"),
    ({"content": "hi", "extra": 1}, "Unknown field"), ({"content": "a\x00b"}, "NUL"),
])
def test_invalid_messages_are_400_and_store_nothing(app, api, conv, body, needle):
    before = counts(app)
    resp = api.post(f"/api/conversations/{conv}/messages", json=body)
    assert resp.status_code == 400 and needle in resp.get_json()["error"]
    assert counts(app) == before


def test_parent_must_be_an_answer_in_this_conversation(api, conv):
    first = ask(api, conv)
    resp = api.post(f"/api/conversations/{conv}/messages",
                    json={"content": "x", "parent_id": first["user_message"]["id"], "stream": False})
    assert resp.status_code == 400
    other = api.post("/api/conversations", json={}).get_json()["id"]
    resp = api.post(f"/api/conversations/{other}/messages",
                    json={"content": "x", "parent_id": first["assistant_message"]["id"], "stream": False})
    assert resp.status_code == 404


def test_other_users_see_nothing_of_mine(app, api, conv):
    mine = ask(api, conv)
    pair = api.post(f"/api/conversations/{conv}/compare", json={"content": "Hi"}).get_json()
    other = ApiClient(app.test_client())
    assert other.get("/api/conversations").get_json()["conversations"] == []
    answer = mine["assistant_message"]["id"]
    for method, url, body in [
        ("get", f"/api/conversations/{conv}", None),
        ("delete", f"/api/conversations/{conv}", None),
        ("post", f"/api/conversations/{conv}/messages", {"content": "hi", "stream": False}),
        ("post", f"/api/conversations/{conv}/compare", {"content": "hi"}),
        ("post", f"/api/messages/{answer}/regenerate", {"stream": False}),
        ("post", f"/api/messages/{mine['user_message']['id']}/edit", {"content": "hi", "stream": False}),
        ("post", f"/api/messages/{answer}/feedback", {"thumb": "down"}),
        ("post", f"/api/pairs/{pair['pair_id']}/vote", {"winner": "a"}),
    ]:
        resp = other.get(url) if method == "get" else (other.delete(url) if method == "delete"
                                                        else other.post(url, json=body))
        assert resp.status_code == 404, (method, url, resp.status_code)
        assert resp.is_json
    assert api.get(f"/api/conversations/{conv}").status_code == 200
    assert counts(app)["feedback"] == 0


def test_state_changes_without_csrf_token_are_rejected(app, api, conv):
    before = counts(app)
    for url, body in [("/api/conversations", {}), (f"/api/conversations/{conv}/messages", {"content": "hi"})]:
        resp = api.client.post(url, json=body)  # no X-CSRFToken header
        assert resp.status_code == 400 and "CSRF" in resp.get_json()["error"]
    resp = api.client.delete(f"/api/conversations/{conv}", headers={"X-CSRFToken": "forged"})
    assert resp.status_code == 400
    assert counts(app) == before


def test_deleted_conversation_rejects_new_messages(app, api, conv):
    answer = ask(api, conv)["assistant_message"]["id"]
    api.delete(f"/api/conversations/{conv}")
    assert api.post(f"/api/conversations/{conv}/messages", json={"content": "hi"}).status_code == 404
    assert api.post(f"/api/messages/{answer}/feedback", json={"thumb": "up"}).status_code == 404


def test_experiment_arm_and_version_recorded_on_every_answer(app, api, conv, micro_model_dir):
    variant_id = register_model(app, micro_model_dir, name="v2-ppo", status="candidate")
    with app.app_context():
        control = db.session.scalars(db.select(ModelVersion).filter_by(status="active")).one()
        exp = Experiment(key="exp-arms", control_version_id=control.id, variant_version_id=variant_id,
                         traffic_split=0.5, status="running")
        db.session.add(exp)
        db.session.commit()
        exp_id = exp.id
    answer = ask(api, conv)["assistant_message"]
    with app.app_context():
        [assignment] = db.session.query(Assignment).all()
        stored = db.session.get(Message, answer["id"])
        assert stored.arm == assignment.arm and stored.experiment_id == exp_id
        expected = "v2-ppo" if assignment.arm == "variant" else "v1-base"
        assert stored.model_version.name == expected
    assert not IDENTITY & set(answer)  # stored, never told (blind arms)
    # compare while an experiment runs: one answer from each arm
    pair = api.post(f"/api/conversations/{conv}/compare", json={"content": "Hi"}).get_json()
    with app.app_context():
        sides = [db.session.get(Message, pair[side]["id"]) for side in ("a", "b")]
        assert {m.arm for m in sides} == {"control", "variant"}
        assert {m.model_version.name for m in sides} == {"v1-base", "v2-ppo"}
