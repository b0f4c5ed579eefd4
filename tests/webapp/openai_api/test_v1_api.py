"""The /v1 API in process (Flask test client): request checking, who the end user is, completions
stored as conversation turns, feedback by completion id, the rail, failures, keys and cookies.
tests/webapp/openai_api/test_v1_sdk.py drives a live server with the official ``openai`` package."""
from __future__ import annotations

import json

import pytest

from tests.support.app import ApiClient, flask_cli, login_admin, make_app, register_model
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.identity import address_hash
from webapp.core.models import (
    ApiKey,
    AuditEvent,
    Conversation,
    Feedback,
    Flag,
    IdentityOrigin,
    Message,
    ModelVersion,
    RailIntervention,
    RailRule,
    User,
)
from webapp.openai_api.keys import create_api_key, hash_key, key_named, revoke_api_key
from webapp.openai_api.users import anon_id_for

MODEL = "rlhf-chat"
RICE = [{"role": "user", "content": "How do I cook rice?"}]


class V1:
    def __init__(self, app, keys):
        self.app, self.keys, self.client = app, keys, app.test_client()

    def headers(self, key: str | None, extra: dict | None = None) -> dict:
        return {**({"Authorization": f"Bearer {self.keys.get(key, key)}"} if key else {}), **(extra or {})}

    def post(self, path, body, key="sdk", headers=None, **kw):
        return self.client.post(path, json=body, headers=self.headers(key, headers), **kw)

    def complete(self, messages=RICE, key="sdk", headers=None, **fields):
        resp = self.post("/v1/chat/completions", {"model": MODEL, "messages": messages, **fields}, key, headers)
        assert resp.status_code == 200, resp.get_data(as_text=True)
        return resp.get_json()

    def db(self, fn):
        with self.app.app_context():
            return fn()


def stream_events(resp) -> list:
    """The JSON events of a streamed completion, then "[DONE]"."""
    out = []
    for block in resp.get_data(as_text=True).split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def error_of(resp, status: int) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True)[:300])
    body = resp.get_json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


def rows(v1, model, **filters):
    return v1.db(lambda: db.session.scalars(db.select(model).filter_by(**filters).order_by(model.id)).all())


# ---------------------------------------------------------------------------- requests checked

@pytest.mark.parametrize("body, param", [
    ({"messages": RICE}, "model"),
    ({"model": 3, "messages": RICE}, "model"),
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": "hi"}, "messages"),
    ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0]"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "a\x00b"}]}, "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "x" * 4001}]}, "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "assistant", "content": "Boil it."}]}, "messages"),  # nothing asked
    ({"model": MODEL, "messages": RICE, "n": 2}, "n"),
    ({"model": MODEL, "messages": RICE, "temperature": 2.5}, "temperature"),
    ({"model": MODEL, "messages": RICE, "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "messages": RICE, "top_p": 1.5}, "top_p"),
    ({"model": MODEL, "messages": RICE, "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "messages": RICE, "max_completion_tokens": 1.5}, "max_completion_tokens"),
    ({"model": MODEL, "messages": RICE, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": MODEL, "messages": RICE, "stop": 7}, "stop"),
    ({"model": MODEL, "messages": RICE, "seed": "7"}, "seed"),
    ({"model": MODEL, "messages": RICE, "stream": "yes"}, "stream"),
    ({"model": MODEL, "messages": RICE, "stream_options": []}, "stream_options"),
    ({"model": MODEL, "messages": RICE, "user": 42}, "user"),
    ({"model": MODEL, "messages": RICE, "user": {"name": "no id"}}, "user.id"),
    ({"model": MODEL, "messages": RICE, "safety_identifier": {"id": "x"}}, "safety_identifier"),
    ({"model": MODEL, "messages": RICE, "user": "a\x00b"}, "user"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}] * 999}, "messages"),  # the probe's request
])
def test_a_wrong_type_or_value_is_a_400_naming_the_param_and_nothing_is_stored(v1, body, param):
    error = error_of(v1.post("/v1/chat/completions", body), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert rows(v1, Message) == [] and rows(v1, User) == []


def test_the_history_is_bounded_in_messages_and_characters(tmp_path, micro_model_dir):
    """One request once carried 999 messages (4-5 s of server time, 1,000 stored rows) at 600
    requests a minute: the number of messages and the history's characters are settings."""
    from webapp.core.settings import Settings

    assert (Settings().api_max_messages, Settings().api_max_history_chars) == (200, 200_000)
    app = make_app(tmp_path / "instance", RLHF_MAX_NEW_TOKENS=4, RLHF_API_MAX_MESSAGES=4,
                   RLHF_API_MAX_HISTORY_CHARS=60)
    register_model(app, micro_model_dir)
    with app.app_context():
        v1 = V1(app, {"sdk": create_api_key("sdk")[1]})
    turn = [{"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi."}]
    many = v1.post("/v1/chat/completions", {"model": MODEL, "messages": turn * 2 + RICE})
    assert error_of(many, 400) == {
        "message": "'messages' has 5 messages; the limit is 4. Send the recent history only.",
        "type": "invalid_request_error", "param": "messages", "code": "array_above_max_length"}
    long = v1.post("/v1/chat/completions", {"model": MODEL, "messages": [
        {"role": "system", "content": "x" * 40}, {"role": "user", "content": "How do I cook rice today?"}]})
    assert error_of(long, 400) == {
        "message": "The messages hold 65 characters; the limit is 60. Send the recent history only.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}
    assert rows(v1, Message) == [] and rows(v1, User) == []
    v1.complete(turn + RICE)  # within both bounds: answered (3 messages, 12 + 3 + 19 characters)
    v1.complete([{"role": "system", "content": "x" * 41}] + RICE)  # exactly 60 characters
    with app.app_context():
        db.engine.dispose()


def test_a_forwarded_user_can_never_be_a_keys_own_identity(v1):
    """A request that names nobody is its key's own user (``key:<id>`` under the key's client); a
    front end forwarding ``user: "key:<id>"`` used to become that same user. It is a user of its
    own now; the identities already stored (keys' own, every other end user) are unchanged."""
    import hashlib

    def user_of(completion_id):
        return v1.db(lambda: db.session.scalars(db.select(Conversation.user_id).join(Message).where(
            Message.completion_id == completion_id)).one())

    ids = v1.db(lambda: {k.name: k.id for k in db.session.scalars(db.select(ApiKey))})
    keyself = user_of(v1.complete(key="owui-2")["id"])
    forged = f"key:{ids['owui-2']}"
    as_user = user_of(v1.complete(key="owui", user=forged)["id"])
    assert as_user != keyself
    assert user_of(v1.complete(key="owui-2", safety_identifier=forged)["id"]) == as_user  # one person per client
    assert user_of(v1.complete(key="owui", headers={"X-OpenWebUI-User-Id": forged})["id"]) == as_user
    sdk_self = user_of(v1.complete(key="sdk")["id"])
    assert user_of(v1.complete(key="sdk", user=f"key:{ids['sdk']}")["id"]) != sdk_self
    assert user_of(v1.complete(key="owui", user="key:alice")["id"]) not in (keyself, as_user)

    def stored(client, name):  # the derivation every stored identity was made with
        return "api-" + hashlib.sha256(f"{client}\0{name}".encode()).hexdigest()[:56]
    with v1.app.app_context():
        assert db.session.get(User, keyself).anon_id == stored("owui", forged)
        assert db.session.get(User, sdk_self).anon_id == stored("sdk", f"key:{ids['sdk']}")
    assert user_of(v1.complete(key="owui", user="alice")["id"]) == v1.db(
        lambda: db.session.scalars(db.select(User.id).filter_by(anon_id=stored("owui", "alice"))).one())
    # feedback naming the forged user finds the forged user's completion, never the key's own
    own = v1.complete(key="owui-2")["id"]
    refused = v1.post("/v1/feedback", {"completion_id": own, "thumb": "up", "user": forged}, key="owui-2")
    assert error_of(refused, 404)["param"] == "completion_id"


@pytest.mark.parametrize("header", ["X-OpenWebUI-Chat-Id", "X-OpenWebUI-Message-Id", "X-OpenWebUI-User-Id"])
@pytest.mark.parametrize("value", ["a\x01b", "tab\tin", "del\x7f"])
def test_a_control_character_in_a_header_is_an_openai_shaped_400(v1, header, value):
    resp = v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE}, key="owui", headers={header: value})
    error = error_of(resp, 400)
    assert error["type"] == "invalid_request_error" and error["param"] == header, error
    assert "control character" in error["message"]
    assert rows(v1, Message) == [] and rows(v1, User) == []


def test_unknown_fields_are_ignored_and_text_parts_and_developer_messages_are_read(v1):
    out = v1.complete([{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "How do I"}, {"type": "text",
                                                                                            "text": "cook rice?"}]}],
                      tools=[], logprobs=False, frequency_penalty=0.5, some_future_field={"x": 1})
    assert out["object"] == "chat.completion" and out["model"] == MODEL and out["id"].startswith("chatcmpl-")
    stored = [(m.role, m.content) for m in rows(v1, Message)]
    assert stored[:2] == [("system", "Be brief."), ("user", "How do I\ncook rice?")]


def test_an_unknown_model_is_a_404_and_the_models_list_names_only_the_public_name(v1):
    error = error_of(v1.post("/v1/chat/completions", {"model": "v1-base", "messages": RICE}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    listed = v1.client.get("/v1/models", headers=v1.headers("sdk")).get_json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == [MODEL]
    assert v1.client.get(f"/v1/models/{MODEL}", headers=v1.headers("sdk")).get_json()["id"] == MODEL
    assert error_of(v1.client.get("/v1/models/v1-base", headers=v1.headers("sdk")), 404)["code"] == "model_not_found"
    # routing errors under /v1 answer in the same shape
    assert error_of(v1.client.get("/v1/nothing", headers=v1.headers("sdk")), 404)["type"] == "invalid_request_error"
    assert error_of(v1.client.post("/v1/models", headers=v1.headers("sdk")), 405)


def test_the_public_name_is_a_setting(tmp_path, micro_model_dir):
    app = make_app(tmp_path / "instance", RLHF_API_MODEL_NAME="house-model")
    register_model(app, micro_model_dir)
    with app.app_context():
        key = create_api_key("k")[1]
    listed = app.test_client().get("/v1/models", headers={"Authorization": f"Bearer {key}"}).get_json()
    assert [m["id"] for m in listed["data"]] == ["house-model"]


def test_generation_settings_are_honoured(v1):
    full = v1.complete(seed=0, temperature=1.0, top_p=1.0)
    assert v1.complete(seed=0, temperature=1.0, top_p=1.0)["choices"][0]["message"]["content"] == \
        full["choices"][0]["message"]["content"]  # a seed gives the same answer
    text = full["choices"][0]["message"]["content"]
    assert full["usage"]["completion_tokens"] == 40 and full["choices"][0]["finish_reason"] == "length"
    assert full["usage"]["total_tokens"] == full["usage"]["prompt_tokens"] + 40
    short = v1.complete(seed=0, temperature=1.0, top_p=1.0, max_completion_tokens=3)
    assert short["usage"]["completion_tokens"] == 3 and short["choices"][0]["finish_reason"] == "length"
    assert text.startswith(short["choices"][0]["message"]["content"])
    # a longer limit than the instance allows is the instance's (RLHF_MAX_NEW_TOKENS)
    assert v1.complete(seed=0, temperature=1.0, top_p=1.0, max_tokens=4000)["usage"]["completion_tokens"] == 40
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = v1.complete(seed=0, temperature=1.0, top_p=1.0, stop=[stop])
    assert cut["choices"][0]["message"]["content"] == text[:text.index(stop)].strip()
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_a_temperature_too_small_to_sample_with_answers_greedily(v1):
    """Logits over 1e-308 overflow to inf: such a temperature answers as 0 does (it was a 503, found by
    tests/webapp/test_api_fuzz.py)."""
    greedy = v1.complete(seed=1, temperature=0)["choices"][0]["message"]["content"]
    for tiny in (1e-308, 5e-5):
        assert v1.complete(seed=2, temperature=tiny)["choices"][0]["message"]["content"] == greedy


# ---------------------------------------------------------------------------- end users

def test_end_users_map_to_stable_app_users_per_client(v1):
    def user_of(completion_id):
        return v1.db(lambda: db.session.scalars(db.select(Conversation.user_id).join(Message).where(
            Message.completion_id == completion_id)).one())

    alice = user_of(v1.complete(user="alice", key="owui")["id"])
    assert user_of(v1.complete(user="alice", key="owui-2")["id"]) == alice  # another key of the same client
    assert user_of(v1.complete(user={"id": "alice", "name": "Alice", "role": "user"}, key="owui")["id"]) == alice
    assert user_of(v1.complete(safety_identifier="alice", key="owui-2")["id"]) == alice
    assert user_of(v1.complete(user="alice", key="sdk")["id"]) != alice  # another client: another person
    # the forwarded header names the user only for a key marked to forward it
    assert user_of(v1.complete(key="owui", headers={"X-OpenWebUI-User-Id": "alice"})["id"]) == alice
    ignored = user_of(v1.complete(key="owui-2", headers={"X-OpenWebUI-User-Id": "alice"})["id"])
    keyself = user_of(v1.complete(key="owui-2")["id"])
    assert ignored == keyself != alice  # no user: the key's own user
    with v1.app.app_context():
        owui = db.session.scalars(db.select(ApiKey).filter_by(name="owui")).one()
        assert db.session.get(User, alice).anon_id == anon_id_for("owui", "alice")
        origin = db.session.get(IdentityOrigin, alice)
        assert origin.address_hash == address_hash(f"api-key:{owui.id}")


def test_new_end_users_are_limited_per_key(tmp_path, micro_model_dir):
    app = make_app(tmp_path / "instance", RLHF_MAX_NEW_TOKENS=4, RLHF_NEW_IDENTITIES_PER_HOUR=2)
    register_model(app, micro_model_dir)
    with app.app_context():
        keys = {name: create_api_key(name, "front")[1] for name in ("a", "b")}
    v1 = V1(app, keys)
    for user in ("u1", "u2"):
        v1.complete(user=user, key="a")
    before = len(rows(v1, User))
    refused = v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE, "user": "u3"}, key="a")
    error = error_of(refused, 429)
    assert "new end users through this API key" in error["message"] and error["code"] == "rate_limit_exceeded"
    assert 0 < int(refused.headers["Retry-After"]) <= 3600
    assert len(rows(v1, User)) == before
    v1.complete(user="u1", key="a")  # known users are never affected
    v1.complete(user="u3", key="b")  # another key has its own allowance
    # the browser's per-address allowance is untouched by API users (same address here)
    assert app.test_client().get("/api/session").status_code == 200


# ---------------------------------------------------------------------------- conversations

def chain(v1, completion_id: str) -> list[tuple[str, str]]:
    """The stored conversation a completion answered (its history, without the answer)."""
    from webapp.core.models import history

    def read():
        answer = db.session.scalars(db.select(Message).filter_by(completion_id=completion_id)).one()
        return [(m["role"], m["content"]) for m in history(answer)][:-1]
    return v1.db(read)


def test_completions_thread_by_history_and_regenerate_as_siblings(v1):
    first = v1.complete(user="bob")
    said = first["choices"][0]["message"]["content"]
    turn = RICE + [{"role": "assistant", "content": said}, {"role": "user", "content": "And pasta?"}]
    second = v1.complete(turn, user="bob")
    assert chain(v1, second["id"]) == [("user", "How do I cook rice?"), ("assistant", said), ("user", "And pasta?")]
    again = v1.complete(turn, user="bob")  # the same question once more: a regenerated answer
    convs = rows(v1, Conversation)
    assert len(convs) == 1 and convs[0].title == "How do I cook rice"
    answers = {m.completion_id: m for m in rows(v1, Message, role="assistant")}
    assert answers[again["id"]].parent_id == answers[second["id"]].parent_id
    # a history nobody stored (edited, or another user's) starts a conversation of its own
    v1.complete(RICE + [{"role": "assistant", "content": "Something else."}, {"role": "user", "content": "Hm?"}],
                user="bob")
    v1.complete(turn, user="carol")
    assert len(rows(v1, Conversation)) == 3
    assert len(rows(v1, Message)) == 5 + 4 + 4  # each new conversation stores the history it was sent


def test_the_front_ends_chat_id_threads_a_conversation(v1):
    chat = {"X-OpenWebUI-Chat-Id": "chat-1", "X-OpenWebUI-Message-Id": "msg-1"}
    first = v1.complete([{"role": "system", "content": "You are kind."}] + RICE, key="owui", user="dana",
                        headers=chat)
    said = first["choices"][0]["message"]["content"]
    history = [{"role": "system", "content": "You are kind."}] + RICE + [{"role": "assistant", "content": said}]
    second = v1.complete(history + [{"role": "user", "content": "And beans?"}], key="owui", user="dana",
                         headers={**chat, "X-OpenWebUI-Message-Id": "msg-2"})
    # an edited earlier question in the same chat: a new branch of the same conversation
    edited = v1.complete([{"role": "system", "content": "You are kind."},
                          {"role": "user", "content": "How do I cook pasta?"}], key="owui", user="dana", headers=chat)
    convs = rows(v1, Conversation)
    assert len(convs) == 1 and convs[0].external_chat_id == "chat-1"
    assert chain(v1, second["id"])[0] == ("system", "You are kind.") and len(chain(v1, second["id"])) == 4
    assert chain(v1, edited["id"])[1] == ("user", "How do I cook pasta?")
    answers = {m.completion_id: m for m in rows(v1, Message, role="assistant")}
    assert answers[first["id"]].external_message_id == "msg-1"
    assert answers[second["id"]].external_message_id == "msg-2"
    assert {m.api_key_id for m in answers.values()} == {v1.db(lambda: db.session.scalars(
        db.select(ApiKey.id).filter_by(name="owui")).one())}
    # the same chat id from another user is another conversation; a deleted one is not continued
    v1.complete(RICE, key="owui", user="erin", headers=chat)
    assert len(rows(v1, Conversation)) == 2
    v1.db(lambda: (setattr(db.session.get(Conversation, convs[0].id), "deleted_at", convs[0].created_at),
                   db.session.commit()))
    v1.complete(history + [{"role": "user", "content": "And beans?"}], key="owui", user="dana", headers=chat)
    assert len(rows(v1, Conversation)) == 3
    assert error_of(v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE}, key="owui",
                            headers={"X-OpenWebUI-Chat-Id": "x" * 201}), 400)


def test_api_answers_are_page_answers_to_the_admin(v1, tmp_path):
    """Feedback given through the API shows in the admin's feedback browser and the exports."""
    out = v1.complete(user="frank")
    v1.post("/v1/feedback", {"completion_id": out["id"], "thumb": "down", "comment": "meh"})
    with v1.app.app_context():
        set_admin_password("root", "admin-password")
    admin = v1.app.test_client()
    login_admin(admin, "root", "admin-password")
    items = admin.get("/api/admin/feedback").get_json()["items"]
    assert [(i["thumb"], i["answer"]) for i in items] == [("down", out["choices"][0]["message"]["content"])]
    export = admin.get("/api/admin/export?format=raw").get_data(as_text=True)
    assert "How do I cook rice?" in export and '"comment": "meh"' in export


# ---------------------------------------------------------------------------- feedback by completion id

def test_feedback_by_completion_id_is_the_chat_pages_feedback(v1):
    out = v1.complete(user="gina", key="owui")
    cid = out["id"]
    resp = v1.post("/v1/feedback", {"completion_id": cid, "thumb": "up", "rating": 4, "reasons": ["helpful"],
                                    "user": "gina"}, key="owui")
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert body["completion_id"] == cid and body["flag"] is None
    assert {k: body["feedback"][k] for k in ("thumb", "rating", "reasons", "correction")} == \
        {"thumb": "up", "rating": 4, "reasons": ["helpful"], "correction": None}
    # an update in place, a correction, a flag; then the flag removed
    body = v1.post("/v1/feedback", {"completion_id": cid, "correction": "Rinse, then simmer 15 minutes.",
                                    "flag": {"category": "other", "note": "odd"}}, key="owui").get_json()
    assert body["feedback"]["thumb"] == "up" and body["feedback"]["correction"].startswith("Rinse")
    assert body["flag"]["category"] == "other" and body["flag"]["note"] == "odd"
    assert len(rows(v1, Feedback)) == 1 and len(rows(v1, Flag)) == 1
    body = v1.post("/v1/feedback", {"completion_id": cid, "flag": None}, key="owui").get_json()
    assert body["flag"] is None and body["feedback"]["rating"] == 4 and rows(v1, Flag) == []
    owner = v1.db(lambda: db.session.scalars(db.select(Conversation.user_id)).one())
    assert [f.user_id for f in rows(v1, Feedback)] == [owner]


@pytest.mark.parametrize("body, status, needle", [
    ({"thumb": "up"}, 400, "completion_id"),
    ({"completion_id": 7, "thumb": "up"}, 400, "completion_id"),
    ({"completion_id": "CID"}, 400, "at least one"),
    ({"completion_id": "CID", "thumb": "sideways"}, 400, "thumb"),
    ({"completion_id": "CID", "rating": 6}, 400, "rating"),
    ({"completion_id": "CID", "reasons": ["great"]}, 400, "reason"),
    ({"completion_id": "CID", "comment": "x" * 2001}, 400, "too long"),
    ({"completion_id": "CID", "flag": "hate"}, 400, "flag"),
    ({"completion_id": "CID", "flag": {"category": "spam"}}, 400, "category"),
    ({"completion_id": "CID", "thumb": "up", "stars": 5}, 400, "Unknown field"),
    ({"completion_id": "CID", "thumb": "up", "user": 5}, 400, "user"),
    ({"completion_id": "chatcmpl-nope", "thumb": "up"}, 404, "No completion"),
    ({"completion_id": "CID", "thumb": "up", "user": "someone-else"}, 404, "No completion"),
])
def test_bad_feedback_is_refused_and_changes_nothing(v1, body, status, needle):
    cid = v1.complete(user="hal")["id"]
    body = {k: (cid if v == "CID" else v) for k, v in body.items()}
    error = error_of(v1.post("/v1/feedback", body), status)
    assert needle.lower() in error["message"].lower(), error
    assert rows(v1, Feedback) == [] and rows(v1, Flag) == []


def test_feedback_only_for_the_keys_own_completions(v1):
    cid = v1.complete(user="ivy", key="owui")["id"]
    for key in ("owui-2", "sdk"):  # even a key of the same client
        assert error_of(v1.post("/v1/feedback", {"completion_id": cid, "thumb": "up"}, key=key), 404)
    v1.db(lambda: (setattr(db.session.scalars(db.select(Conversation)).one(), "deleted_at",
                           db.func.current_timestamp()), db.session.commit()))
    assert error_of(v1.post("/v1/feedback", {"completion_id": cid, "thumb": "up"}, key="owui"), 404)
    assert rows(v1, Feedback) == []


# ---------------------------------------------------------------------------- the rail, failures, disconnects

def test_no_answer_is_empty(v1):
    # the embedded model began 1 sampled answer in 60 with its end token (seed 25 of these: an empty
    # answer, 1 completion token); the first token is never the end now (rlhf.generation.batcher)
    for seed in range(60):
        choice = v1.complete(seed=seed)["choices"][0]
        assert choice["message"]["content"].strip(), (seed, choice)


def test_the_rail_applies_to_api_answers(v1):
    full = v1.complete(seed=3, temperature=1.0, top_p=1.0)["choices"][0]["message"]["content"]
    words = full.split()
    blocked = next(w for w in words[len(words) // 2:] if w.isalpha() and len(w) >= 3 and w.lower() not in
                   " ".join(words[:len(words) // 2]).lower())
    v1.db(lambda: (db.session.add(RailRule(kind="phrase", value=blocked)), db.session.commit()))
    # whole answer: the refusal, ended as OpenAI ends a filtered answer
    out = v1.complete(seed=3, temperature=1.0, top_p=1.0)
    assert out["choices"][0]["finish_reason"] == "content_filter"
    assert out["choices"][0]["message"]["content"] == "Sorry, I can't share that answer."
    # streamed: the text released before the block went out and stays; nothing of the blocked word
    resp = v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE, "seed": 3, "temperature": 1.0,
                                            "top_p": 1.0, "stream": True})
    events = stream_events(resp)
    sent = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    assert events[-2]["choices"][0]["finish_reason"] == "content_filter" and events[-1] == "[DONE]"
    assert sent and blocked.lower() not in sent.lower() and full.startswith(sent.strip())
    stored = rows(v1, Message, completion_id=events[0]["id"])[0]
    assert stored.content == sent.strip()
    assert len(rows(v1, RailIntervention)) == 2
    # blocked before anything went out: the refusal is the streamed answer (the seeded answer above is not
    # empty; an unseeded one can be, and an empty answer has nothing to block: CI run of 2026-11-29)
    v1.db(lambda: (db.session.add(RailRule(kind="pattern", value=r"\S")), db.session.commit()))
    events = stream_events(v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE, "seed": 3,
                                                            "temperature": 1.0, "top_p": 1.0, "stream": True}))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == \
        "Sorry, I can't share that answer."
    assert events[-2]["choices"][0]["finish_reason"] == "content_filter"


def test_a_generation_failure_is_reported_in_openai_shape_and_nothing_is_stored(v1):
    v1.complete()  # loads the model
    with v1.app.app_context():
        model = next(iter(v1.app.extensions["model_pool"]._models.values())).model
    before = len(rows(v1, Message))

    def broken_forward(module, args):
        raise RuntimeError("CUDA out of memory")

    hook = model.register_forward_pre_hook(broken_forward)
    try:
        error = error_of(v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE}), 503)
        assert "failed to answer" in error["message"] and error["type"] == "server_error"
        events = stream_events(v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE, "stream": True}))
        assert events[-2]["error"]["message"].startswith("Generation failed") and events[-1] == "[DONE]"
    finally:
        hook.remove()
    assert len(rows(v1, Message)) == before


def test_no_model_that_can_serve_is_a_503(v1):
    def break_it():
        db.session.scalars(db.select(ModelVersion)).one().path = "/nonexistent/model"
        db.session.commit()
    v1.db(break_it)
    error = error_of(v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE}), 503)
    assert error["type"] == "server_error" and "v1-base" not in error["message"]
    assert rows(v1, Message) == []


def test_a_client_that_goes_away_mid_stream_stops_the_answer(v1, monkeypatch):
    """The worker is held after a few steps until the answer's cancel event is set (by the
    disconnect), so the answer cannot run to its end first: what is stored is what was sent."""
    import webapp.openai_api.completions as completions

    full = v1.complete(seed=0, temperature=1.0, top_p=1.0)
    assert full["usage"]["completion_tokens"] == 40
    handles = []

    def spy(*args, **kwargs):
        handle = completions_stream_prompt(*args, **kwargs)
        handles.append(handle)
        return handle

    completions_stream_prompt = completions.stream_prompt
    monkeypatch.setattr(completions, "stream_prompt", spy)
    with v1.app.app_context():
        model = next(iter(v1.app.extensions["model_pool"]._models.values())).model
    calls = []

    def hold(module, args):
        calls.append(1)
        if len(calls) > 25:  # the prefill and 24 steps (the first words), then wait for the client to go
            assert handles[-1].cancel.wait(60)

    hook = model.register_forward_pre_hook(hold)
    try:
        resp = v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE, "seed": 0, "temperature": 1.0,
                                                "top_p": 1.0, "stream": True}, buffered=False)
        received = ""
        for raw in resp.response:
            for block in raw.decode().split("\n\n"):
                if block.startswith("data: {"):
                    received += json.loads(block[6:])["choices"][0]["delta"].get("content", "")
            if received.strip():
                break
        resp.close()  # the client goes away
    finally:
        hook.remove()
    handle = handles[-1]
    assert handle.cancel.is_set() and handle.result.finish_reason == "cancelled"
    assert handle.result.token_count <= 27 < 40  # stopped, not run to its end
    stored = rows(v1, Message, role="assistant")[-1]
    assert stored.content == received.strip() and full["choices"][0]["message"]["content"].startswith(stored.content)


# ---------------------------------------------------------------------------- keys and cookies

def test_keys_are_checked_in_the_database_on_every_request(v1):
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Basic abc"},
                    {"Authorization": "Bearer rlhf-not-a-key"}, {"Authorization": "Bearer " + v1.keys["sdk"][:-1]}):
        error = error_of(v1.client.get("/v1/models", headers=headers), 401)
        assert error["code"] == "invalid_api_key"
    assert v1.client.get("/v1/models", headers=v1.headers("sdk")).status_code == 200
    with v1.app.app_context():
        revoke_api_key(key_named("sdk"))
    error = error_of(v1.client.get("/v1/models", headers=v1.headers("sdk")), 401)
    assert "revoked" in error["message"]
    assert v1.client.get("/v1/models", headers=v1.headers("owui")).status_code == 200


def test_answered_requests_are_counted_on_the_key_and_refused_ones_change_nothing(v1):
    def usage():
        row = v1.db(lambda: db.session.scalars(db.select(ApiKey).filter_by(name="sdk")).one())
        return row.request_count, row.last_used_at

    assert usage() == (0, None)
    v1.client.get("/v1/models", headers=v1.headers("sdk"))
    v1.complete()
    events = stream_events(v1.post("/v1/chat/completions", {"model": MODEL, "messages": RICE, "stream": True}))
    assert events[-1] == "[DONE]"
    count, used = usage()
    assert count == 3 and used is not None
    error_of(v1.post("/v1/chat/completions", {"model": MODEL, "messages": []}), 400)
    error_of(v1.post("/v1/feedback", {"completion_id": "chatcmpl-none", "thumb": "up"}), 404)
    assert usage() == (3, used)


def test_the_api_never_sets_a_cookie_nor_reads_one_for_identity(v1):
    browser = ApiClient(v1.app.test_client())  # a visitor with a session cookie
    resp = browser.client.get("/v1/models", headers=v1.headers("sdk"))
    assert resp.status_code == 200 and "Set-Cookie" not in resp.headers
    resp = browser.client.post("/v1/chat/completions", json={"model": MODEL, "messages": RICE},
                               headers=v1.headers("sdk"))
    assert resp.status_code == 200 and "Set-Cookie" not in resp.headers  # and no CSRF token was needed
    owner = v1.db(lambda: db.session.scalars(db.select(Conversation.user_id)).one())
    assert owner != browser.user_id
    assert browser.client.get("/v1/models").status_code == 401  # the cookie is no key
    for path in ("/v1/models", "/v1/unknown"):
        assert "Set-Cookie" not in browser.client.get(path).headers


def test_the_cli_prints_the_key_once_and_stores_its_hash(tmp_path, micro_model_dir, monkeypatch):
    instance = tmp_path / "instance"
    register_model(make_app(instance), micro_model_dir)
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(instance))
    result = flask_cli("create-api-key", "librechat", "--client", "lc", "--rate-limit", "5 per second")
    assert result.exit_code == 0, result.output
    key = result.stdout.strip()
    assert key.startswith("rlhf-") and len(key) > 40 and "\n" not in key
    assert "shown only this once" in result.stderr and key not in result.stderr
    assert flask_cli("create-api-key", "librechat").exit_code != 0  # names are unique
    refused = flask_cli("create-api-key", "bad", "--rate-limit", "lots")
    assert refused.exit_code == 1 and refused.output == ("Error: 'lots' is not a rate limit (e.g. '30 per minute' "
                                                         "or '30 per minute; 500 per day').\n")
    app = make_app(instance)
    with app.app_context():
        assert db.session.scalars(db.select(ApiKey).filter_by(name="bad")).first() is None  # no key was made
        row = db.session.scalars(db.select(ApiKey).filter_by(name="librechat")).one()
        assert (row.client, row.rate_limit, row.prefix) == ("lc", "5 per second", key[:12])
        assert row.key_hash == hash_key(key)
        dump = "\n".join(db.session.connection().connection.driver_connection.iterdump())
    assert key not in dump and key[12:] not in dump
    listed = flask_cli("list-api-keys").stdout
    assert "librechat" in listed and key[:12] in listed and key[12:] not in listed and "active" in listed
    assert flask_cli("revoke-api-key", "librechat").stdout.strip() == "Revoked API key 'librechat'."
    assert "revoked" in flask_cli("list-api-keys").stdout
    assert flask_cli("revoke-api-key", "nobody").exit_code != 0
    assert app.test_client().get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401


def test_the_admin_creates_lists_and_revokes_keys(v1):
    with v1.app.app_context():
        set_admin_password("root", "admin-password")
    admin = v1.app.test_client()
    login_admin(admin, "root", "admin-password")
    csrf = admin.get("/api/session").get_json()["csrf_token"]
    created = admin.post("/api/admin/api-keys", json={"name": "new-front", "forwards_user_headers": True},
                         headers={"X-CSRFToken": csrf})
    assert created.status_code == 201 and created.headers["Cache-Control"] == "no-store"
    key, row = created.get_json()["key"], created.get_json()["api_key"]
    assert row["client"] == "new-front" and row["forwards_user_headers"] and row["created_by"] == "root"
    assert admin.post("/api/admin/api-keys", json={"name": "new-front"}, headers={"X-CSRFToken": csrf}
                      ).status_code == 409
    for bad in ("x" * 81, " ", "tab\there", {"name": "x"}):
        assert admin.post("/api/admin/api-keys", json={"name": bad}, headers={"X-CSRFToken": csrf}
                          ).status_code == 400, bad
    listed = admin.get("/api/admin/api-keys").get_data(as_text=True)
    assert "new-front" in listed and key not in listed and hash_key(key) not in listed
    page = admin.get("/admin/api-keys").get_data(as_text=True)
    assert "new-front" in page and key not in page and "Revoke" in page
    # the page's form shows a new key once, on the answer to the form
    token = admin.get("/admin/api-keys").get_data(as_text=True).split('name="csrf_token" value="')[1].split('"')[0]
    shown = admin.post("/admin/api-keys", data={"name": "form-key", "csrf_token": token})
    assert shown.status_code == 200 and shown.headers["Cache-Control"] == "no-store"
    form_key = shown.get_data(as_text=True).split('data-testid="api-key-value">')[1].split("<")[0]
    assert form_key.startswith("rlhf-") and form_key not in admin.get("/admin/api-keys").get_data(as_text=True)
    assert v1.client.get("/v1/models", headers={"Authorization": f"Bearer {form_key}"}).status_code == 200
    # revoke (JSON, then the form): refused at once
    revoked = admin.post(f"/api/admin/api-keys/{row['id']}/revoke", headers={"X-CSRFToken": csrf})
    assert revoked.status_code == 200 and revoked.get_json()["api_key"]["revoked"]
    assert v1.client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 401
    form_id = v1.db(lambda: db.session.scalars(db.select(ApiKey.id).filter_by(name="form-key")).one())
    assert admin.post(f"/admin/api-keys/{form_id}/revoke", data={"csrf_token": token}).status_code == 303
    assert v1.client.get("/v1/models", headers={"Authorization": f"Bearer {form_key}"}).status_code == 401
    actions = [(e.action, e.actor, e.subject) for e in rows(v1, AuditEvent) if e.action.startswith("api_key")]
    assert ("api_key_create", "root", "new-front") in actions and ("api_key_revoke", "root", "form-key") in actions
    assert all(key not in json.dumps(e.detail) for e in rows(v1, AuditEvent))
