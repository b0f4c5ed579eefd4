"""Sessions and sign-in under attack (webapp/core/signin.py): a copied cookie stops working when its
owner signs out, changes the password or is signed out by an admin; admin sessions end when idle
or too old; usernames are one name whatever their case or surrounding whitespace (rate limits
included); an unknown name costs a password hash like a wrong password; a new CSRF token at
sign-in; HSTS behind HTTPS; oversized bodies are refused unread; ``next=`` cannot break a redirect.
The same revocation across two server processes: tests/webapp/core/test_sessions_live.py."""
from __future__ import annotations

import io
import re
import time

import pytest
from click.testing import CliRunner
from flask.cli import FlaskGroup
from sqlalchemy.exc import IntegrityError

from tests.support.app import ApiClient, make_app
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import AuditEvent, User
from webapp.core.settings import ConfigError

ADMIN_PASSWORD = "admin password 1"
PASSWORD = "member password 1"
HOUR = 3600


@pytest.fixture
def admin_app(app):
    with app.app_context():
        set_admin_password("secadmin", ADMIN_PASSWORD)
    return app


def login_page_token(client) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)


def admin_login(app, username: str = "secadmin", password: str = ADMIN_PASSWORD, address: str = "127.0.0.1",
                next_: str = ""):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    token = login_page_token(client)
    resp = client.post("/admin/login" + (f"?next={next_}" if next_ else ""),
                       data={"username": username, "password": password, "csrf_token": token})
    return client, resp


def signed_in_admin(app):
    client, resp = admin_login(app)
    assert resp.status_code == 302, resp.get_data(as_text=True)[:300]
    return client


def copy_of(app, client):
    """Another client holding a copy of ``client``'s session cookie (what a thief would have)."""
    thief = app.test_client()
    thief.set_cookie("session", client.get_cookie("session").value)
    return thief


def register(app, username: str = "member1") -> ApiClient:
    api = ApiClient(app.test_client())
    resp = api.post("/api/account/register", json={"username": username, "password": PASSWORD})
    assert resp.status_code == 201, resp.get_data(as_text=True)
    return api


# ---------------------------------------------------------------------------- revocation

def test_admin_logout_ends_a_copied_cookie(admin_app):
    admin = signed_in_admin(admin_app)
    thief = copy_of(admin_app, admin)
    assert thief.get("/api/admin/audit").status_code == 200
    token = admin.get("/api/session").get_json()["csrf_token"]
    assert admin.post("/admin/logout", data={"csrf_token": token}).status_code == 302
    assert thief.get("/api/admin/audit").status_code == 401
    assert thief.get("/api/session").get_json()["is_admin"] is False
    assert thief.get("/admin/").status_code == 302  # to the login page


def test_create_admin_password_reset_ends_every_session_of_that_admin(admin_app):
    admin = signed_in_admin(admin_app)
    thief = copy_of(admin_app, admin)
    with admin_app.app_context():
        set_admin_password("second", ADMIN_PASSWORD)  # another admin, whose session must survive
    second, _ = admin_login(admin_app, "second")
    result = CliRunner().invoke(FlaskGroup(create_app=lambda: admin_app), ["create-admin", "secadmin",
                                                                           "--password-stdin"],
                                input="a new admin password\n")
    assert result.exit_code == 0 and "Updated admin 'secadmin'" in result.output, result.output
    for client in (admin, thief):
        assert client.get("/api/session").get_json()["is_admin"] is False
        assert client.get("/api/admin/audit").status_code == 401
    assert second.get("/api/admin/audit").status_code == 200  # another admin is not affected
    assert admin_login(admin_app, password="a new admin password")[1].status_code == 302


def test_end_user_sign_out_ends_a_copied_cookie(app):
    alice = register(app)
    assert alice.post("/api/conversations", json={"title": "private"}).status_code == 201
    thief = copy_of(app, alice.client)
    stolen = thief.get("/api/session").get_json()
    assert stolen["username"] == "member1"
    assert alice.post("/api/account/logout").get_json() == {"signed_out": True}
    after = thief.get("/api/session").get_json()
    assert after["username"] is None and after["user_id"] != alice.user_id
    assert thief.get("/api/conversations").get_json()["conversations"] == []
    # the browser that signed out starts over as a new anonymous visitor, like the thief
    mine = alice.get("/api/session").get_json()
    assert mine["username"] is None and mine["user_id"] not in (alice.user_id, after["user_id"])
    # signing in again works, and sees the conversation
    back = ApiClient(app.test_client())
    assert back.post("/api/account/login", json={"username": "member1", "password": PASSWORD}).status_code == 200
    assert [c["title"] for c in back.get("/api/conversations").get_json()["conversations"]] == ["private"]


def test_password_change_ends_the_other_sessions_and_keeps_this_one(app):
    laptop = register(app)
    phone = ApiClient(app.test_client())
    assert phone.post("/api/account/login", json={"username": "member1", "password": PASSWORD}).status_code == 200
    thief = copy_of(app, laptop.client)
    resp = phone.post("/api/account/password", json={"password": PASSWORD, "new_password": "a brand new secret"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.get_json()["username"] == "member1"
    assert phone.get("/api/session").get_json()["username"] == "member1"  # this browser stays signed in
    assert phone.post("/api/conversations", json={}).status_code == 201
    for client in (laptop.client, thief):
        assert client.get("/api/session").get_json()["username"] is None
    fresh = ApiClient(app.test_client())
    assert fresh.post("/api/account/login", json={"username": "member1", "password": PASSWORD}).status_code == 401
    assert fresh.post("/api/account/login", json={"username": "member1",
                                                  "password": "a brand new secret"}).status_code == 200


@pytest.mark.parametrize("body, status, message", [
    ({"password": "wrong password", "new_password": "a brand new secret"}, 403, "not your current password"),
    ({"password": PASSWORD, "new_password": "short"}, 400, "'new_password' must be at least 8 characters"),
    ({"password": PASSWORD}, 400, "'new_password' is required"),
    ({"new_password": "a brand new secret"}, 400, "'password' is required"),
    ({"password": PASSWORD, "new_password": "a brand new secret", "username": "x"}, 400, "Unknown field"),
])
def test_password_change_rules(app, body, status, message):
    member = register(app)
    resp = member.post("/api/account/password", json=body)
    assert resp.status_code == status and message in resp.get_json()["error"], resp.get_json()
    assert member.get("/api/session").get_json()["username"] == "member1"  # nothing ended


def test_password_change_needs_an_end_user_session(admin_app):
    anonymous = ApiClient(admin_app.test_client())
    body = {"password": PASSWORD, "new_password": "a brand new secret"}
    resp = anonymous.post("/api/account/password", json=body)
    assert resp.status_code == 401 and "Sign in" in resp.get_json()["error"]
    admin = signed_in_admin(admin_app)
    token = admin.get("/api/session").get_json()["csrf_token"]
    resp = admin.post("/api/account/password", json={"password": ADMIN_PASSWORD, "new_password": "x" * 10},
                      headers={"X-CSRFToken": token})
    assert resp.status_code == 403 and "create-admin" in resp.get_json()["error"]


def test_admin_signs_an_account_out_everywhere(admin_app):
    member = register(admin_app)
    thief = copy_of(admin_app, member.client)
    anonymous = ApiClient(admin_app.test_client())
    admin = signed_in_admin(admin_app)
    headers = {"X-CSRFToken": admin.get("/api/session").get_json()["csrf_token"]}
    resp = admin.post(f"/api/admin/users/{member.user_id}/sign-out", headers=headers)
    assert resp.status_code == 200 and resp.get_json() == {"user_id": member.user_id, "username": "member1",
                                                           "signed_out": True}
    for client in (member.client, thief):
        assert client.get("/api/session").get_json()["username"] is None
    with admin_app.app_context():
        event = db.session.scalars(db.select(AuditEvent).filter_by(action="sign_out_everywhere")).one()
        assert (event.actor, event.subject, event.detail) == ("secadmin", "member1", {"user_id": member.user_id})
        me = db.session.scalars(db.select(User).filter_by(username="secadmin")).one().id
    for user_id, status, text in ((anonymous.user_id, 400, "anonymous visitor"), (me, 400, "Log out"),
                                  (10**6, 404, "not found")):
        resp = admin.post(f"/api/admin/users/{user_id}/sign-out", headers=headers)
        assert resp.status_code == status and text in resp.get_json()["error"], resp.get_json()
    assert admin.get("/api/admin/audit").status_code == 200  # still signed in
    # the member signs in again as usual
    assert ApiClient(admin_app.test_client()).post("/api/account/login", json={
        "username": "member1", "password": PASSWORD}).status_code == 200


# ---------------------------------------------------------------------------- lifetimes

def set_session(client, **values):
    with client.session_transaction() as sess:
        sess.update(values)


def cookie_expiry(resp) -> float:
    from email.utils import parsedate_to_datetime

    header = resp.headers["Set-Cookie"]
    return parsedate_to_datetime(re.search(r"Expires=([^;]+)", header).group(1)).timestamp()


class Clock:
    """The sign-in module's clock, moved by the test (``time`` in webapp.core.signin)."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now


def test_admin_session_ends_when_idle_and_activity_moves_the_limit(admin_app, monkeypatch):
    from webapp.core import signin

    clock = Clock()
    monkeypatch.setattr(signin, "time", clock)
    admin = signed_in_admin(admin_app)
    clock.now += 11 * HOUR
    assert admin.get("/api/admin/audit").status_code == 200  # 11 h idle: still signed in ...
    clock.now += 11 * HOUR
    assert admin.get("/api/admin/audit").status_code == 200  # ... and that request was activity: 11 h idle again
    clock.now += 12 * HOUR + 60
    assert admin.get("/api/admin/audit").status_code == 401  # over 12 h since the last request
    assert admin.get("/api/session").get_json()["is_admin"] is False


def test_admin_session_ends_after_its_lifetime_however_active(admin_app):
    admin = signed_in_admin(admin_app)
    now = int(time.time())
    set_session(admin, _signed_in_at=now - 6 * 24 * HOUR, _seen_at=now)
    assert admin.get("/api/admin/audit").status_code == 200
    set_session(admin, _signed_in_at=now - 7 * 24 * HOUR - 60, _seen_at=now)
    assert admin.get("/api/admin/audit").status_code == 401


def test_admin_session_lifetimes_are_settings(tmp_path, micro_model_dir):
    app = make_app(tmp_path / "instance", RLHF_ADMIN_SESSION_IDLE_HOURS=1, RLHF_ADMIN_SESSION_MAX_HOURS=2)
    with app.app_context():
        set_admin_password("secadmin", ADMIN_PASSWORD)
    admin = signed_in_admin(app)
    set_session(admin, _seen_at=int(time.time()) - 2 * HOUR)
    assert admin.get("/api/admin/audit").status_code == 401
    admin = signed_in_admin(app)
    set_session(admin, _signed_in_at=int(time.time()) - 3 * HOUR)
    assert admin.get("/api/admin/audit").status_code == 401
    with app.app_context():
        db.engine.dispose()
    for name in ("RLHF_ADMIN_SESSION_IDLE_HOURS", "RLHF_ADMIN_SESSION_MAX_HOURS", "RLHF_MAX_REQUEST_MB"):
        with pytest.raises(ConfigError, match=rf"{name}=0 \(create_app\(config\)\) must be > 0"):
            make_app(tmp_path / "bad", **{name: 0})


def test_admin_cookie_expires_with_the_session_and_is_not_renewed_past_its_lifetime(admin_app):
    client = admin_app.test_client()
    token = login_page_token(client)
    before = time.time()
    resp = client.post("/admin/login", data={"username": "secadmin", "password": ADMIN_PASSWORD, "csrf_token": token})
    assert resp.status_code == 302
    assert before + 12 * HOUR - 5 <= cookie_expiry(resp) <= time.time() + 12 * HOUR + 5  # idle limit, not 31 days
    # activity moves the idle limit: a request two hours after the last one renews it to 12 h from now
    set_session(client, _seen_at=int(time.time()) - 2 * HOUR)
    resp = client.get("/api/session")
    assert resp.get_json()["is_admin"] is True
    assert abs(cookie_expiry(resp) - (time.time() + 12 * HOUR)) <= 5  # not 10 h: the request was activity
    # ... but never past the absolute lifetime
    signed_in_at = int(time.time()) - 7 * 24 * HOUR + HOUR  # an hour of the week left
    set_session(client, _signed_in_at=signed_in_at, _seen_at=int(time.time()) - 120)
    resp = client.get("/api/session")
    assert resp.get_json()["is_admin"] is True
    assert abs(cookie_expiry(resp) - (signed_in_at + 7 * 24 * HOUR)) <= 2


def test_end_user_sessions_stay_long_lived(app):
    member = register(app)
    long_ago = int(time.time()) - 60 * 24 * HOUR
    set_session(member.client, _signed_in_at=long_ago)  # an admin's would be over
    assert member.get("/api/session").get_json()["username"] == "member1"
    resp = member.get("/api/session")
    assert cookie_expiry(resp) > time.time() + 30 * 24 * HOUR  # the usual 31 days from the last page load


def test_a_cookie_without_a_generation_is_not_signed_in(admin_app):
    """A session signed in without the generation (forged with the key, or from before it existed)."""
    with admin_app.app_context():
        admin_id = db.session.scalars(db.select(User).filter_by(username="secadmin")).one().id
    client = admin_app.test_client()
    set_session(client, _user_id=str(admin_id), _fresh=True)
    assert client.get("/api/admin/audit").status_code == 401


# ---------------------------------------------------------------------------- usernames are one name

VARIANTS = [" secadmin", "secadmin ", "\tsecadmin", "SecAdmin", "secadmin\n", "\u00a0secadmin",
            "\uff53\uff45\uff43\uff41\uff44\uff4d\uff49\uff4e"]  # the last: fullwidth letters (NFKC: secadmin)


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
def test_admin_login_variants_are_the_same_account(admin_app, variant):
    client, resp = admin_login(admin_app, variant)
    assert resp.status_code == 302 and client.get("/api/session").get_json()["is_admin"] is True


def test_admin_login_limit_counts_every_variant_of_a_name(tmp_path):
    app = make_app(tmp_path / "instance", RLHF_LOGIN_RATE_LIMIT="3 per minute")
    with app.app_context():
        set_admin_password("secadmin", ADMIN_PASSWORD)
    codes = [admin_login(app, name, "wrong password", "10.0.0.1")[1].status_code
             for name in ["secadmin", " secadmin", "SECADMIN "]]
    assert codes == [401, 401, 401]  # three attempts on one name, from one address
    for variant in ["secadmin", *VARIANTS]:
        resp = admin_login(app, variant, ADMIN_PASSWORD, "10.0.0.1")[1]
        assert resp.status_code == 429, (variant, resp.status_code)
        assert "Too many login attempts for this username" in resp.get_data(as_text=True)
    assert admin_login(app, "another", "wrong password", "10.0.0.1")[1].status_code == 401
    # never across addresses: the name's own admin signs in from anywhere else
    assert admin_login(app, VARIANTS[3], ADMIN_PASSWORD, "10.0.0.2")[1].status_code == 302
    with app.app_context():
        db.engine.dispose()


def test_account_login_limit_counts_every_variant_of_a_name(tmp_path):
    app = make_app(tmp_path / "instance", RLHF_ACCOUNT_RATE_LIMIT="3 per minute")
    register(app, "member1")
    codes = []
    for name in ["member1", " MEMBER1", "member1\t", "Member1", "\u00a0member1"]:
        api = ApiClient(app.test_client())
        codes.append(api.post("/api/account/login", json={"username": name, "password": "wrong password"}).status_code)
    assert codes == [401, 401, 429, 429, 429]  # registering was the name's first attempt from this address
    # never across addresses: wrong passwords from here do not lock the member out elsewhere
    api = ApiClient(app.test_client())
    assert api.post("/api/account/login", json={"username": "MEMBER1", "password": PASSWORD},
                    environ_base={"REMOTE_ADDR": "10.0.9.9"}).status_code == 200
    with app.app_context():
        db.engine.dispose()


def test_usernames_are_unique_regardless_of_case_and_whitespace(admin_app):
    register(admin_app, "Member1")
    taken = ApiClient(admin_app.test_client()).post("/api/account/register", json={"username": " member1 ",
                                                                                  "password": PASSWORD})
    assert taken.status_code == 409
    with admin_app.app_context():
        user, created = set_admin_password(" SECADMIN ", "another admin password")  # the same admin
        assert not created and user.username == "secadmin"
        assert db.session.scalar(db.select(db.func.count()).select_from(User).where(User.is_admin)) == 1
        db.session.add(User(username="MEMBER1"))  # the database refuses a second spelling too
        with pytest.raises(IntegrityError):
            db.session.commit()
        db.session.rollback()


def test_create_admin_does_not_take_over_an_end_users_account(app):
    member = register(app, "Alice")
    result = CliRunner().invoke(FlaskGroup(create_app=lambda: app), ["create-admin", "alice", "--password-stdin"],
                                input="an admin password\n")
    assert result.exit_code == 1 and "'Alice' is an end user's account" in result.output, result.output
    with app.app_context():
        assert not db.session.get(User, member.user_id).is_admin
    assert member.get("/api/session").get_json()["username"] == "Alice"  # still signed in, still no admin


def test_registered_names_are_stored_trimmed(app):
    api = ApiClient(app.test_client())
    resp = api.post("/api/account/register", json={"username": "  Spaced_Name\t", "password": PASSWORD})
    assert resp.status_code == 201 and resp.get_json()["username"] == "Spaced_Name"


# ---------------------------------------------------------------------------- one hash per sign-in attempt

@pytest.fixture
def hash_calls(monkeypatch):
    """How many password hashes werkzeug computes (however the app imported its helpers)."""
    import werkzeug.security

    calls = []
    real = werkzeug.security._hash_internal

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(werkzeug.security, "_hash_internal", counting)
    return calls


def test_every_failed_sign_in_costs_one_password_hash(admin_app, hash_calls):
    member = register(admin_app, "member1")
    member.post("/api/account/logout")
    api = ApiClient(admin_app.test_client())
    admin_login(admin_app, "warm-up", "wrong password")  # the first unknown name makes the dummy hash
    attempts = {
        "admin: wrong password": lambda: admin_login(admin_app, "secadmin", "wrong password")[1],
        "admin: unknown name": lambda: admin_login(admin_app, "nobody", "wrong password")[1],
        "admin: an end user's name": lambda: admin_login(admin_app, "member1", PASSWORD)[1],
        "admin: impossible name": lambda: admin_login(admin_app, "no such name!", "wrong password")[1],
        "account: wrong password": lambda: api.post("/api/account/login", json={"username": "member1",
                                                                                "password": "wrong password"}),
        "account: unknown name": lambda: api.post("/api/account/login", json={"username": "nobody",
                                                                              "password": "wrong password"}),
        "account: an admin's name": lambda: api.post("/api/account/login", json={"username": "secadmin",
                                                                                 "password": ADMIN_PASSWORD}),
        "account: impossible name": lambda: api.post("/api/account/login", json={"username": "no such name!",
                                                                                 "password": "wrong password"}),
    }
    for what, attempt in attempts.items():
        hash_calls.clear()
        assert attempt().status_code == 401, what
        assert len(hash_calls) == 1, (what, hash_calls)


# ---------------------------------------------------------------------------- CSRF token at sign-in

def test_admin_login_starts_a_new_csrf_token(admin_app):
    client = admin_app.test_client()
    old = login_page_token(client)
    assert client.post("/admin/login", data={"username": "secadmin", "password": ADMIN_PASSWORD,
                                             "csrf_token": old}).status_code == 302
    new = client.get("/api/session").get_json()["csrf_token"]
    assert new != old
    refused = client.post("/admin/logout", data={"csrf_token": old})
    assert refused.status_code == 400 and "CSRF" in refused.get_data(as_text=True)
    assert client.post("/admin/logout", data={"csrf_token": new}).status_code == 302


def test_account_sign_in_starts_a_new_csrf_token(app):
    register(app, "member1").post("/api/account/logout")
    api = ApiClient(app.test_client())
    old = api.csrf
    resp = api.post("/api/account/login", json={"username": "member1", "password": PASSWORD})
    new = resp.get_json()["csrf_token"]
    assert resp.status_code == 200 and new != old
    refused = api.client.post("/api/conversations", json={}, headers={"X-CSRFToken": old})
    assert refused.status_code == 400 and "CSRF" in refused.get_json()["error"]
    assert api.client.post("/api/conversations", json={}, headers={"X-CSRFToken": new}).status_code == 201
    # the same token: a signed copy's payload (its signature carries the second it was signed, which a
    # busy machine can cross between the two requests)
    assert api.get("/api/session").get_json()["csrf_token"].split(".")[0] == new.split(".")[0]


# ---------------------------------------------------------------------------- HSTS

def test_hsts_only_when_served_over_https(tmp_path, app):
    plain = app.test_client()
    assert "Strict-Transport-Security" not in plain.get("/").headers
    secure_app = make_app(tmp_path / "secure", RLHF_COOKIE_SECURE=True)
    client = secure_app.test_client()
    for resp in (client.get("/"), client.get("/api/session"), client.get("/admin/login"), client.get("/nope")):
        assert resp.headers["Strict-Transport-Security"] == "max-age=31536000"
    with secure_app.app_context():
        db.engine.dispose()


# ---------------------------------------------------------------------------- request size

class CountingStream(io.RawIOBase):
    """A request body of ``size`` bytes that counts what the server reads of it."""

    def __init__(self, size: int, chunk: bytes = b" "):
        self.size, self.pos, self.read_bytes, self.chunk = size, 0, 0, chunk

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:  # the test client measures the body by seeking to its end
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = {0: 0, 1: self.pos, 2: self.size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self.size - self.pos))
        buffer[:n] = self.chunk * n
        self.pos += n
        self.read_bytes += n
        return n


FIFTY_MB = 50 * 1024 * 1024


def test_a_50_mb_json_body_is_refused_unread(app):
    api = ApiClient(app.test_client())
    conv = api.post("/api/conversations", json={}).get_json()["id"]
    for url in ("/api/conversations", f"/api/conversations/{conv}/messages", "/api/account/login"):
        body = CountingStream(FIFTY_MB)
        resp = api.client.post(url, input_stream=body, content_length=FIFTY_MB, content_type="application/json",
                               headers={"X-CSRFToken": api.csrf})
        assert resp.status_code == 413, (url, resp.status_code)
        assert resp.get_json() == {"error": "The request body is too large (the limit is 1 MiB)."}
        assert body.read_bytes == 0, url
    # without a CSRF token too: nothing is read before the size is checked
    body = CountingStream(FIFTY_MB)
    assert api.client.post("/api/conversations", input_stream=body, content_length=FIFTY_MB,
                           content_type="application/json").status_code == 413
    assert body.read_bytes == 0


def test_a_50_mb_form_is_a_readable_page(admin_app):
    client = admin_app.test_client()
    body = CountingStream(FIFTY_MB, b"a")
    resp = client.post("/admin/login", input_stream=body, content_length=FIFTY_MB,
                       content_type="application/x-www-form-urlencoded")
    html = resp.get_data(as_text=True)
    assert resp.status_code == 413 and resp.mimetype == "text/html"
    assert "413" in html and "The request body is too large (the limit is 1 MiB)." in html
    assert body.read_bytes == 0


def test_bodies_within_the_limit_are_served_and_the_limit_is_a_setting(tmp_path, app):
    api = ApiClient(app.test_client())
    resp = api.post("/api/conversations", json={"title": "x" * 900_000})  # under 1 MiB: validated as usual
    assert resp.status_code == 400 and "too long" in resp.get_json()["error"]
    small = make_app(tmp_path / "small", RLHF_MAX_REQUEST_MB=0.01)
    api = ApiClient(small.test_client())
    resp = api.post("/api/conversations", json={"title": "x" * 20_000})
    assert resp.status_code == 413 and "the limit is 10.24 KiB" in resp.get_json()["error"]
    with small.app_context():
        db.engine.dispose()


def test_a_chunked_body_over_the_limit_is_a_413_not_a_400(app):
    """A body without a Content-Length (Transfer-Encoding: chunked, as gunicorn passes it on) is
    measured too: over the limit it is a 413 (under /v1 in OpenAI's shape), not a truncated body
    that reads as broken JSON (400)."""
    from webapp.openai_api.keys import create_api_key

    with app.app_context():
        key = create_api_key("chunked")[1]
    api = ApiClient(app.test_client())
    gunicorn = {"wsgi.input_terminated": True}  # what gunicorn sets: the server ends the stream
    big = b'{"title": "' + b"x" * (1024 * 1024) + b'"}'

    def send(url, body, headers):
        return api.client.post(url, input_stream=io.BytesIO(body), content_type="application/json",
                               headers={"Transfer-Encoding": "chunked", **headers}, environ_base=gunicorn)

    resp = send("/api/conversations", big, {"X-CSRFToken": api.csrf})
    assert (resp.status_code == 413
            and resp.get_json() == {"error": "The request body is too large (the limit is 1 MiB)."})
    resp = send("/v1/chat/completions", big, {"Authorization": f"Bearer {key}"})
    assert resp.status_code == 413
    assert resp.get_json() == {"error": {"message": "The request body is too large (the limit is 1 MiB).",
                                         "type": "invalid_request_error", "param": None, "code": "request_too_large"}}
    small = send("/api/conversations", b'{"title": "chunked"}', {"X-CSRFToken": api.csrf})
    assert small.status_code == 201 and small.get_json()["title"] == "chunked"  # within the limit: read as usual
    with app.app_context():
        assert db.session.scalars(db.select(User.id)).all() == [api.user_id]  # /v1 made no user for the 413


# ---------------------------------------------------------------------------- next=

NEXTS = ["/admin/%0D%0AX:1", "/admin/%0AX-Injected:1", "/admin/%0D", "/admin/%09x", "/admin/%00",
         "/admin/%E2%80%A8", "/admin/\\\\evil.example", "/admin/x%20y", "//evil.example/admin",
         "https://evil.example/admin", "/adminx", "/admin/..%2F..%2F%0D%0A"]


@pytest.mark.parametrize("target", NEXTS)
def test_next_never_breaks_the_redirect(admin_app, target):
    client, resp = admin_login(admin_app, next_=target)  # signing in
    assert resp.status_code == 302 and resp.location == "/admin/", resp.location
    again = client.get(f"/admin/login?next={target}")  # already signed in
    assert again.status_code == 302 and again.location == "/admin/", again.location


def test_next_keeps_same_site_admin_paths(admin_app):
    client, resp = admin_login(admin_app, next_="/admin/raters?status=new%26x")
    assert resp.status_code == 302 and resp.location == "/admin/raters?status=new&x"
    assert client.get("/admin/login?next=/admin/runs").location == "/admin/runs"
    # a page that needs a login sends its path along
    anonymous = admin_app.test_client()
    assert anonymous.get("/admin/versions").location == "/admin/login?next=/admin/versions"
