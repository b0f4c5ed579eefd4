"""End-user accounts (webapp/chat/account.py): registering keeps the visitor's conversations,
signing in elsewhere gives them back, signing out starts over; clear 4xx messages for bad input;
hashed passwords; rate-limited attempts; a signed-in end user is never an admin."""
from __future__ import annotations

import pytest
from werkzeug.security import check_password_hash

from tests.support.app import ApiClient, make_app
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import User

PASSWORD = "correct horse battery"


def titles(api) -> list[str]:
    return [c["title"] for c in api.get("/api/conversations").get_json()["conversations"]]


def test_register_keeps_the_conversations_and_signing_in_elsewhere_gets_them(app):
    alice = ApiClient(app.test_client())
    assert alice.post("/api/conversations", json={"title": "rice questions"}).status_code == 201
    with alice.client.session_transaction() as sess:
        old_cookie_id = sess["anon_id"]

    anonymous_token = alice.csrf
    resp = alice.post("/api/account/register", json={"username": "alice_1", "password": PASSWORD})
    assert resp.status_code == 201, resp.get_data(as_text=True)
    body = resp.get_json()
    assert body == {"user_id": alice.user_id, "username": "alice_1", "signed_in": True,
                    "csrf_token": body["csrf_token"]}
    assert body["csrf_token"] != anonymous_token  # a new token at sign-in
    session = alice.get("/api/session").get_json()
    assert (session["user_id"], session["username"], session["is_admin"]) == (alice.user_id, "alice_1", False)
    assert titles(alice) == ["rice questions"]  # the same user: nothing moved, nothing lost
    with app.app_context():
        user = db.session.get(User, alice.user_id)
        assert user.password_hash != PASSWORD and check_password_hash(user.password_hash, PASSWORD)
        assert user.anon_id is None and not user.is_admin

    # another browser: its own anonymous visitor until it signs in
    phone = ApiClient(app.test_client())
    assert phone.user_id != alice.user_id and titles(phone) == []
    resp = phone.post("/api/account/login", json={"username": "ALICE_1", "password": PASSWORD})  # any case
    assert resp.status_code == 200 and resp.get_json()["user_id"] == alice.user_id
    assert titles(phone) == ["rice questions"]
    assert phone.post("/api/conversations", json={"title": "from the phone"}).status_code == 201
    assert sorted(titles(alice)) == ["from the phone", "rice questions"]

    # signing out: the browser starts over as a new anonymous visitor
    assert phone.post("/api/account/logout").get_json() == {"signed_out": True}
    after = phone.get("/api/session").get_json()
    assert after["user_id"] != alice.user_id and after["username"] is None and titles(phone) == []
    # signing out when not signed in changes nothing (the anonymous identity stays)
    assert phone.post("/api/account/logout", headers={"X-CSRFToken": after["csrf_token"]}).get_json() == \
        {"signed_out": False}
    assert phone.get("/api/session").get_json()["user_id"] == after["user_id"]

    # an old copy of the anonymous cookie no longer opens the account
    stale = app.test_client()
    with stale.session_transaction() as sess:
        sess["anon_id"] = old_cookie_id
    assert stale.get("/api/session").get_json()["user_id"] != alice.user_id


@pytest.mark.parametrize("body, status, message", [
    ({"username": "al", "password": PASSWORD}, 400, "'username' must be 3-32 characters"),
    ({"username": "alice smith", "password": PASSWORD}, 400, "letters, digits, '.', '-' or '_'"),
    ({"username": "<b>x</b>", "password": PASSWORD}, 400, "'username' must be 3-32 characters"),
    ({"username": "_alice", "password": PASSWORD}, 400, "starting with a letter or digit"),
    ({"username": "a" * 33, "password": PASSWORD}, 400, "'username' must be 3-32 characters"),
    ({"password": PASSWORD}, 400, "'username' is required."),
    ({"username": "bob", "password": "short"}, 400, "'password' must be at least 8 characters."),
    ({"username": "bob", "password": "x" * 201}, 400, "'password' is too long"),
    ({"username": "bob", "password": "\ud800" * 9}, 400, "unpaired surrogate"),
    ({"username": "bob", "password": 12345678}, 400, "'password' must be a string."),
    ({"username": ["bob"], "password": PASSWORD}, 400, "'username' must be a string."),
    ({"username": "bob", "password": PASSWORD, "admin": True}, 400, "Unknown field(s): admin."),
    ({"username": "Taken", "password": PASSWORD}, 409, "That username is taken"),
])
def test_registration_rules_have_clear_messages(app, body, status, message):
    taken = ApiClient(app.test_client())
    assert taken.post("/api/account/register", json={"username": "taken", "password": PASSWORD}).status_code == 201
    api = ApiClient(app.test_client())
    with app.app_context():
        before = db.session.scalar(db.select(db.func.count()).select_from(User).where(User.username.is_not(None)))
    resp = api.post("/api/account/register", json=body)
    assert resp.status_code == status and resp.is_json
    assert message in resp.get_json()["error"], resp.get_json()
    with app.app_context():  # nothing registered
        assert db.session.scalar(db.select(db.func.count()).select_from(User)
                                 .where(User.username.is_not(None))) == before


def test_sign_in_failures_say_the_same_thing(app):
    with app.app_context():
        set_admin_password("root", PASSWORD)
    owner = ApiClient(app.test_client())
    owner.post("/api/account/register", json={"username": "carol", "password": PASSWORD})
    api = ApiClient(app.test_client())
    for body in ({"username": "carol", "password": "wrong password"}, {"username": "nobody", "password": PASSWORD},
                 {"username": "root", "password": PASSWORD},  # admins sign in at /admin/login only
                 {"username": "car ol\ud800", "password": PASSWORD}):
        resp = api.post("/api/account/login", json=body)
        assert resp.status_code == 401 and resp.get_json() == {"error": "Wrong username or password."}, body
    assert api.get("/api/session").get_json()["username"] is None
    assert api.post("/api/account/login", json={"username": "carol"}).get_json()["error"] == "'password' is required."
    assert api.post("/api/account/login", data="username=carol").status_code == 400  # not JSON
    # a signed-in user cannot register a second account on top
    assert owner.post("/api/account/register", json={"username": "carol2", "password": PASSWORD}).status_code == 409


def test_a_signed_in_end_user_is_no_admin(app):
    user = ApiClient(app.test_client())
    user.post("/api/account/register", json={"username": "dave", "password": PASSWORD})
    assert user.get("/api/session").get_json()["is_admin"] is False
    assert user.get("/api/admin/metrics").status_code == 401
    assert user.get("/api/admin/raters").status_code == 401
    assert user.post("/api/admin/runs", json={}).status_code == 401
    page = user.get("/admin/")
    assert page.status_code == 302 and "/admin/login" in page.location
    assert user.get("/admin/raters").status_code == 302


def test_sign_in_attempts_are_rate_limited(tmp_path):
    app = make_app(tmp_path / "instance", RLHF_ACCOUNT_RATE_LIMIT="3 per minute")
    api = ApiClient(app.test_client())
    statuses = [api.post("/api/account/login", json={"username": f"guess{i}", "password": "wrong password"})
                for i in range(4)]
    assert [r.status_code for r in statuses] == [401, 401, 401, 429]
    assert "Too many sign-in attempts" in statuses[-1].get_json()["error"]
    assert int(statuses[-1].headers["Retry-After"]) > 0
    # one username from one address is limited, never from the others: nobody can lock a member out
    app2 = make_app(tmp_path / "other", RLHF_ACCOUNT_RATE_LIMIT="2 per minute")
    member = ApiClient(app2.test_client())
    assert member.post("/api/account/register", json={"username": "victim", "password": "right password"},
                       environ_base={"REMOTE_ADDR": "192.0.2.200"}).status_code == 201
    member.post("/api/account/logout")
    codes = []
    for i in range(3):
        client = ApiClient(app2.test_client())
        codes.append([client.post("/api/account/login", json={"username": "victim", "password": "guess guess"},
                                  environ_base={"REMOTE_ADDR": f"192.0.2.{i}"}).status_code for _ in range(3)])
    assert codes == [[401, 401, 429]] * 3
    fresh = ApiClient(app2.test_client())
    assert fresh.post("/api/account/login", json={"username": "victim", "password": "right password"},
                      environ_base={"REMOTE_ADDR": "192.0.2.99"}).status_code == 200
