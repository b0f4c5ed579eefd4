"""Security headers, the session cookie's flags, and the rate limits of chat, feedback and login
(per user and per address: 429 with Retry-After, JSON for the API, a page for forms)."""
from __future__ import annotations

import re
import time

import pytest

from tests.support.app import ApiClient, make_app, register_model
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db
from webapp.core.models import Message
from webapp.core.settings import ConfigError

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
       "base-uri 'self'; form-action 'self'; frame-ancestors 'none'")
PASSWORD = "correct horse"


@pytest.fixture
def limited_app(tmp_path, micro_model_dir):
    """Returns make(**config): an app (micro model, short answers, admin 'root') with the given limits."""
    apps = []

    def make(**config):
        application = make_app(tmp_path / f"instance{len(apps)}", RLHF_MAX_NEW_TOKENS=4, **config)
        register_model(application, micro_model_dir)
        with application.app_context():
            set_admin_password("root", PASSWORD)
        apps.append(application)
        return application
    yield make
    for application in apps:
        with application.app_context():
            db.session.remove()
            db.engine.dispose()


def user(app, address: str = "127.0.0.1") -> ApiClient:
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return ApiClient(client)


def ask(api: ApiClient, conv: int | None = None):
    if conv is None:
        conv = api.post("/api/conversations", json={}).get_json()["id"]
    return api.post(f"/api/conversations/{conv}/messages", json={"content": "How do I cook rice?", "stream": False})


def assert_limited(resp, text: str) -> int:
    assert resp.status_code == 429, resp.get_data(as_text=True)
    assert resp.is_json and set(resp.get_json()) == {"error"}
    assert text in resp.get_json()["error"] and "Try again in" in resp.get_json()["error"]
    retry_after = int(resp.headers["Retry-After"])
    assert 0 < retry_after <= 60
    return retry_after


# ---------------------------------------------------------------------------- headers

def test_security_headers_on_every_kind_of_response(app, client):
    responses = {
        "chat page": client.get("/"),
        "API": client.get("/api/session"),
        "login page": client.get("/admin/login"),
        "static file": client.get("/static/js/chat/main.js"),
        "API 404": client.get("/api/conversations/999"),
        "page 404": client.get("/no-such-page"),
        "CSRF 400": client.post("/api/conversations", json={}),
        "admin redirect": client.get("/admin/"),
    }
    for name, resp in responses.items():
        assert resp.headers.get("Content-Security-Policy") == CSP, name
        assert resp.headers.get("X-Content-Type-Options") == "nosniff", name
        assert resp.headers.get("X-Frame-Options") == "DENY", name
        assert resp.headers.get("Referrer-Policy") == "same-origin", name
    assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP


INLINE = [(re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "inline <script>"),
          (re.compile(r"<style", re.I), "<style> element"),
          (re.compile(r"\sstyle\s*=", re.I), "style attribute"),
          (re.compile(r"\son[a-z]+\s*=", re.I), "inline event handler"),
          (re.compile(r"javascript:", re.I), "javascript: URL")]


def test_pages_have_nothing_the_csp_would_block(app, client):
    """Every server-rendered page: no inline scripts, styles or handlers (the browser tests also
    fail on any CSP violation the console reports)."""
    with app.app_context():
        set_admin_password("root", PASSWORD)
    pages = {"/": client.get("/"), "/admin/login": client.get("/admin/login"), "404": client.get("/nope")}
    token = re.search(r'name="csrf_token" value="([^"]+)"', pages["/admin/login"].get_data(as_text=True)).group(1)
    assert client.post("/admin/login", data={"username": "root", "password": PASSWORD,
                                             "csrf_token": token}).status_code == 302
    for url in ("/admin/", "/admin/experiments", "/admin/runs", "/admin/versions", "/admin/feedback"):
        pages[url] = client.get(url)
    for url, resp in pages.items():
        html = resp.get_data(as_text=True)
        assert "<html" in html, url
        for pattern, what in INLINE:
            assert not pattern.search(html), f"{url}: {what}: {pattern.search(html).group(0)!r}"


# ---------------------------------------------------------------------------- cookie

def session_cookie(client) -> str:
    return client.get("/api/session").headers["Set-Cookie"]


def test_session_cookie_is_httponly_lax_and_not_secure_by_default(client):
    cookie = session_cookie(client)
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Secure" not in cookie  # the default run is plain http on localhost


def test_session_cookie_is_secure_when_configured(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_COOKIE_SECURE", "1")
    app = make_app(tmp_path / "instance")
    cookie = session_cookie(app.test_client())
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    # ... the admin's login too (it is the same session cookie)
    client = app.test_client()
    with app.app_context():
        set_admin_password("root", PASSWORD)
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    resp = client.post("/admin/login", data={"username": "root", "password": PASSWORD, "csrf_token": token})
    assert (resp.status_code == 302 and "Secure" in resp.headers["Set-Cookie"]
            and "HttpOnly" in resp.headers["Set-Cookie"])
    with app.app_context():
        db.engine.dispose()


# ---------------------------------------------------------------------------- rate limits: chat

def test_chat_limit_per_user_counts_messages_regenerate_and_compare(limited_app):
    app = limited_app(RLHF_CHAT_RATE_LIMIT="3 per minute")
    alice = user(app)
    conv = alice.post("/api/conversations", json={}).get_json()["id"]
    first = ask(alice, conv)
    assert first.status_code == 201
    answer = first.get_json()["assistant_message"]["id"]
    assert alice.post(f"/api/messages/{answer}/regenerate", json={"stream": False}).status_code == 201
    assert alice.post(f"/api/conversations/{conv}/compare", json={"content": "Hi"}).status_code == 201
    with app.app_context():
        stored = db.session.scalar(db.select(db.func.count(Message.id)))
    assert_limited(ask(alice, conv), "Too many messages from you")
    assert_limited(alice.post(f"/api/messages/{answer}/regenerate", json={"stream": False}), "messages from you")
    assert_limited(alice.post(f"/api/conversations/{conv}/compare", json={"content": "Hi"}), "messages from you")
    assert_limited(alice.post(f"/api/conversations/{conv}/messages", json={"content": "Hi"}), "messages from you")
    with app.app_context():  # a refused request writes nothing
        assert db.session.scalar(db.select(db.func.count(Message.id))) == stored
    # another user behind the same address is not affected; feedback has its own budget
    assert ask(user(app)).status_code == 201
    assert alice.post(f"/api/messages/{answer}/feedback", json={"thumb": "up"}).status_code == 200


def test_chat_limit_per_address(limited_app):
    app = limited_app(RLHF_CHAT_RATE_LIMIT_PER_ADDRESS="3 per minute")
    for _ in range(3):
        assert ask(user(app, "10.0.0.1")).status_code == 201
    late = user(app, "10.0.0.1")  # a fresh cookie does not get around it
    assert_limited(ask(late), "Too many messages from your network address")
    assert ask(user(app, "10.0.0.2")).status_code == 201  # another address is not affected


def test_streamed_message_is_limited_before_streaming(limited_app):
    app = limited_app(RLHF_CHAT_RATE_LIMIT="1 per minute")
    alice = user(app)
    conv = alice.post("/api/conversations", json={}).get_json()["id"]
    assert alice.post(f"/api/conversations/{conv}/messages", json={"content": "Hi"}).mimetype == "text/event-stream"
    assert_limited(alice.post(f"/api/conversations/{conv}/messages", json={"content": "Hi"}), "messages from you")


# ---------------------------------------------------------------------------- rate limits: feedback

def test_feedback_limit_per_user_counts_feedback_and_votes(limited_app):
    app = limited_app(RLHF_FEEDBACK_RATE_LIMIT="3 per minute")
    alice = user(app)
    conv = alice.post("/api/conversations", json={}).get_json()["id"]
    pair = alice.post(f"/api/conversations/{conv}/compare", json={"content": "Hi"}).get_json()
    answer = pair["a"]["id"]
    assert alice.post(f"/api/messages/{answer}/feedback", json={"thumb": "up"}).status_code == 200
    assert alice.post(f"/api/messages/{answer}/feedback", json={"rating": 4}).status_code == 200
    assert alice.post(f"/api/pairs/{pair['pair_id']}/vote", json={"winner": "a"}).status_code == 200
    assert_limited(alice.post(f"/api/messages/{answer}/feedback", json={"rating": 5}), "Too many feedback requests")
    assert_limited(alice.post(f"/api/pairs/{pair['pair_id']}/vote", json={"winner": "b"}), "feedback requests from you")
    got = alice.get(f"/api/conversations/{conv}").get_json()
    assert got["comparisons"][0]["winner"] == "a"  # the refused vote changed nothing
    assert next(m for m in got["messages"] if m["id"] == answer)["feedback"]["rating"] == 4
    # another user on the same address can still rate
    bob = user(app)
    bob_answer = ask(bob).get_json()["assistant_message"]["id"]
    assert bob.post(f"/api/messages/{bob_answer}/feedback", json={"thumb": "down"}).status_code == 200


def test_feedback_limit_per_address(limited_app):
    app = limited_app(RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS="2 per minute")
    rated = []
    for address in ("10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2"):
        api = user(app, address)
        answer = ask(api).get_json()["assistant_message"]["id"]
        rated.append(api.post(f"/api/messages/{answer}/feedback", json={"thumb": "up"}))
    assert [r.status_code for r in rated] == [200, 200, 429, 200]
    assert_limited(rated[2], "Too many feedback requests from your network address")


def test_limit_resets_after_its_window(limited_app):
    app = limited_app(RLHF_FEEDBACK_RATE_LIMIT="2 per 2 seconds")
    alice = user(app)
    answer = ask(alice).get_json()["assistant_message"]["id"]
    for thumb in ("up", "down"):
        assert alice.post(f"/api/messages/{answer}/feedback", json={"thumb": thumb}).status_code == 200
    refused = alice.post(f"/api/messages/{answer}/feedback", json={"thumb": "up"})
    retry_after = assert_limited(refused, "feedback requests from you")
    assert retry_after <= 2
    time.sleep(retry_after + 1.1)
    assert alice.post(f"/api/messages/{answer}/feedback", json={"thumb": "up"}).status_code == 200


# ---------------------------------------------------------------------------- rate limits: login

def login(app, username: str, address: str, password: str = "wrong password"):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    return client.post("/admin/login", data={"username": username, "password": password, "csrf_token": token})


def assert_limited_page(resp, text: str) -> None:
    assert resp.status_code == 429 and resp.mimetype == "text/html"
    html = resp.get_data(as_text=True)
    assert "429 Too Many Requests" in html and text in html and "Try again in" in html
    assert 0 < int(resp.headers["Retry-After"]) <= 60


def test_login_limit_per_address_is_a_readable_page(limited_app):
    app = limited_app(RLHF_LOGIN_RATE_LIMIT_PER_ADDRESS="3 per minute")
    codes = [login(app, f"guess{i}", "10.0.0.1").status_code for i in range(3)]
    assert codes == [401, 401, 401]
    assert_limited_page(login(app, "someone", "10.0.0.1"), "Too many login attempts from your network address")
    assert_limited_page(login(app, "root", "10.0.0.1", PASSWORD), "Too many login attempts")  # even the right one
    assert login(app, "root", "10.0.0.2", PASSWORD).status_code == 302


def test_wrong_passwords_from_other_addresses_never_lock_the_admin_out(limited_app):
    """The probe's lockout: wrong attempts for "admin" from other addresses made the right password
    from a fresh address a 429. A name is limited per address, never across addresses."""
    app = limited_app(RLHF_LOGIN_RATE_LIMIT="3 per minute")
    for address in ("10.0.1.1", "10.0.1.2", "10.0.1.3"):
        assert [login(app, "root", address).status_code for _ in range(3)] == [401, 401, 401]
    assert login(app, "ROOT", "10.0.1.9", PASSWORD).status_code == 302  # the admin, from a fresh address


def test_login_limit_per_name_from_one_address(limited_app):
    app = limited_app(RLHF_LOGIN_RATE_LIMIT="3 per minute", RLHF_LOGIN_RATE_LIMIT_PER_ADDRESS="10 per minute")
    assert [login(app, "root", "10.0.2.1").status_code for _ in range(3)] == [401, 401, 401]
    assert_limited_page(login(app, " Root", "10.0.2.1", PASSWORD), "Too many login attempts for this username")
    assert login(app, "other", "10.0.2.1").status_code == 401  # other names from that address still try
    assert login(app, "root", "10.0.2.2", PASSWORD).status_code == 302  # that name from elsewhere too


def test_failed_admin_sign_ins_are_shown_on_the_overview(limited_app):
    from webapp.core.models import SigninFailure

    app = limited_app()
    for _ in range(2):
        assert login(app, "Root ", "10.0.3.1").status_code == 401
    assert login(app, "<b>nobody</b>", "2001:db8::7").status_code == 401
    assert login(app, "root", "10.0.3.2", PASSWORD).status_code == 302  # a success is no failure
    with app.app_context():
        rows = {(r.username, r.address): r.failures for r in db.session.scalars(db.select(SigninFailure))}
    assert rows == {("root", "10.0.3.1"): 2, ("<b>nobody</b>", "2001:db8::7"): 1}
    admin = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', admin.get("/admin/login").get_data(as_text=True)).group(1)
    admin.post("/admin/login", data={"username": "root", "password": PASSWORD, "csrf_token": token})
    html = admin.get("/admin/").get_data(as_text=True)
    section = html[html.index('data-testid="signin-failures"'):]
    section = section[:section.index("</section>")]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
             for row in re.findall(r"<tr data-failure>(.*?)</tr>", section, re.S)]
    assert [cells[i][:3] for i in range(2)] == [["&lt;b&gt;nobody&lt;/b&gt;", "2001:db8::7", "1"],
                                                ["root", "10.0.3.1", "2"]]  # newest first, escaped
    assert all("<time" in row[3] for row in cells)


# ---------------------------------------------------------------------------- configuration

def test_default_limits_leave_room_for_many_users_behind_one_address():
    from limits import parse_many

    from webapp.core.settings import Settings

    defaults = Settings()

    def per_minute(name):
        return min(item.amount * 60 / item.get_expiry() for item in parse_many(getattr(defaults, name)))
    assert per_minute("chat_rate_limit_per_address") >= 10 * per_minute("chat_rate_limit")
    assert per_minute("feedback_rate_limit_per_address") >= 10 * per_minute("feedback_rate_limit")
    assert defaults.ratelimit_enabled is True


def test_limits_come_from_the_environment_and_bad_values_name_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_CHAT_RATE_LIMIT", "5 per minute; 100 per day")
    assert make_app(tmp_path / "a").config["RLHF_CHAT_RATE_LIMIT"] == "5 per minute; 100 per day"
    monkeypatch.setenv("RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS", "lots")
    with pytest.raises(ConfigError,
                       match=r"RLHF_FEEDBACK_RATE_LIMIT_PER_ADDRESS='lots' \(environment\) is not a rate limit"):
        make_app(tmp_path / "b")


@pytest.mark.parametrize("value, needle", [
    ("1 per 0 second", "a period of 0"), ("0 per minute", "allows no request"),
    ("30 per minute; 5/0hour", "a period of 0"), ("10 per 0 minutes", "a period of 0"),
])
def test_a_limit_that_allows_nothing_or_has_no_period_is_refused(tmp_path, value, needle):
    """``1 per 0 second`` used to be read as ``1 per 1 second`` without a word, ``0 per minute`` as
    a limit that refuses everything: both stop the app with the setting named, and an API key's
    own limit is refused the same way."""
    from webapp.openai_api.keys import KeyProblem, create_api_key

    with pytest.raises(ConfigError, match=rf"RLHF_LOGIN_RATE_LIMIT='{re.escape(value)}' \(create_app\(config\)\) "
                                          rf"is not a usable rate limit: .*{needle}"):
        make_app(tmp_path / "a", RLHF_LOGIN_RATE_LIMIT=value)
    app = make_app(tmp_path / "b")
    with app.app_context():
        with pytest.raises(KeyProblem, match=needle):
            create_api_key("limited", rate_limit=value)
        create_api_key("fine", rate_limit="10 per 5 seconds; 100 per day")
        db.engine.dispose()


def test_the_access_log_leaves_query_strings_out():
    """gunicorn's default access log line holds the request line with its query string (and the
    referrer's): a token in a URL would be written to the log. `serve`'s format has neither."""
    from datetime import timedelta
    from types import SimpleNamespace

    from gunicorn.config import Config
    from gunicorn.glogging import Logger

    from webapp.cli.processes import gunicorn_settings

    cfg = Config()
    for name, value in gunicorn_settings("127.0.0.1", 8000, 1, 4).items():
        cfg.set(name, value)
    logger = Logger(cfg)
    lines = []
    logger.access_log.info = lambda fmt, atoms: lines.append(fmt % atoms)
    environ = {"REQUEST_METHOD": "GET", "RAW_URI": "/admin/feedback?q=secret-term&token=sk-live-1",
               "PATH_INFO": "/admin/feedback", "QUERY_STRING": "q=secret-term&token=sk-live-1",
               "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "192.0.2.7", "HTTP_USER_AGENT": "probe/1",
               "HTTP_REFERER": "http://127.0.0.1:8000/admin/feedback?q=other-secret"}
    logger.access(SimpleNamespace(status="200 OK", sent=12, headers=[]), SimpleNamespace(headers=[]), environ,
                  timedelta(milliseconds=5))
    assert len(lines) == 1 and '"GET /admin/feedback HTTP/1.1" 200 12' in lines[0] and "192.0.2.7" in lines[0]
    assert "secret" not in lines[0] and "sk-live" not in lines[0] and "?" not in lines[0], lines[0]


def test_limits_can_be_switched_off(limited_app, monkeypatch):
    monkeypatch.setenv("RLHF_RATELIMIT_ENABLED", "0")
    app = limited_app(RLHF_FEEDBACK_RATE_LIMIT="1 per minute")
    alice = user(app)
    answer = ask(alice).get_json()["assistant_message"]["id"]
    assert [alice.post(f"/api/messages/{answer}/feedback", json={"rating": r}).status_code
            for r in (1, 2, 3)] == [200, 200, 200]
