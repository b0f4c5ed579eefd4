"""Admin accounts: the CLI, signing in and out, rate limits; every admin route needs an admin and its CSRF token."""
from __future__ import annotations

import re

from click.testing import CliRunner
from flask.cli import FlaskGroup

from tests.support.admin import PASSWORD, Admin, login, versions
from tests.support.app import ApiClient
from webapp import create_app
from webapp.core.extensions import db
from webapp.core.models import Experiment, User


def test_create_admin_cli_hashes_the_password(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_INSTANCE_DIR", str(tmp_path))
    run = lambda *a, **k: CliRunner().invoke(FlaskGroup(create_app=lambda: create_app()), list(a), **k)  # noqa: E731
    result = run("create-admin", "alice", "--password-stdin", input="s3cret-pass\n")
    assert result.exit_code == 0 and "Created admin 'alice'" in result.output
    prompted = run("create-admin", "bob", input="another-pass\nanother-pass\n")
    assert prompted.exit_code == 0, prompted.output
    short = run("create-admin", "carol", "--password-stdin", input="short\n")
    assert short.exit_code == 1 and "at least 8 characters" in short.output
    bad = run("create-admin", "no spaces", "--password-stdin", input="long-enough\n")
    assert bad.exit_code == 1 and "username" in bad.output
    app = create_app({"INSTANCE_DIR": str(tmp_path)})
    with app.app_context():
        alice = db.session.scalars(db.select(User).filter_by(username="alice")).one()
        assert alice.is_admin and alice.password_hash != "s3cret-pass" and "s3cret-pass" not in alice.password_hash
        assert db.session.scalars(db.select(User).filter_by(username="carol")).first() is None
    assert login(app, "alice", "s3cret-pass")[2].status_code == 302


def test_login_logout_and_wrong_password(setup):
    app, _ = setup
    client, token, resp = login(app, password="wrong password")
    assert resp.status_code == 401 and "Wrong username or password." in resp.get_data(as_text=True)
    assert client.get("/api/admin/versions").status_code == 401
    client, token, resp = login(app)
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/admin/")
    assert client.get("/api/admin/versions").status_code == 200
    assert client.get("/api/session").get_json()["is_admin"] is True
    assert client.post("/admin/logout", data={"csrf_token": token}).status_code == 302
    assert client.get("/api/admin/versions").status_code == 401


def test_login_redirect_stays_on_site(setup):
    app, _ = setup
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    resp = client.post("/admin/login?next=//evil.example/admin", data={"username": "root", "password": PASSWORD,
                                                                       "csrf_token": token})
    assert resp.headers["Location"].endswith("/admin/")


def test_login_is_rate_limited(setup):
    app, _ = setup
    client = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    codes = [client.post("/admin/login",
                         data={"username": "root", "password": f"guess{i}", "csrf_token": token}).status_code
             for i in range(12)]
    assert codes[:10] == [401] * 10 and codes[10] == 429
    limited = client.post("/admin/login", data={"username": "root", "password": PASSWORD, "csrf_token": token})
    assert limited.status_code == 429 and "Retry-After" in limited.headers
    assert client.get("/api/admin/versions").status_code == 401  # even the right password did not get in


def test_anonymous_visitors_cannot_log_in_without_a_password(setup):
    app, _ = setup
    anon = app.test_client()
    uid = anon.get("/api/session").get_json()["user_id"]
    with app.app_context():
        name = db.session.get(User, uid).anon_id
    assert login(app, username=name, password="")[2].status_code == 401


# ---------------------------------------------------------------------------- authorization matrix

ADMIN_GETS = ["/api/admin/metrics", "/api/admin/experiments", "/api/admin/versions", "/api/admin/runs",
              "/api/admin/runs/1", "/api/admin/feedback", "/api/admin/export?format=pairs", "/api/admin/audit"]
ADMIN_WRITES = [("post", "/api/admin/experiments", {"key": "x", "control_version_id": 1, "variant_version_id": 2}),
                ("patch", "/api/admin/experiments/x", {"traffic_split": 0.3}),
                ("post", "/api/admin/experiments/x/start", None), ("post", "/api/admin/experiments/x/stop", None),
                ("post", "/api/admin/experiments/x/conclude", {"decision": "promote"}),
                ("post", "/api/admin/versions/2/promote", None), ("post", "/api/admin/versions/1/rollback", None),
                ("post", "/api/admin/runs", {})]
ADMIN_PAGES = ["/admin/", "/admin/experiments", "/admin/experiments/x", "/admin/experiment", "/admin/runs",
               "/admin/runs/1", "/admin/versions", "/admin/settings", "/admin/feedback"]


def test_every_admin_route_needs_an_admin(setup):
    app, _ = setup
    visitor = ApiClient(app.test_client())  # a chat user with a session and a valid CSRF token
    for url in ADMIN_GETS:
        for client in (app.test_client(), visitor.client):
            resp = client.get(url)
            assert resp.status_code == 401 and resp.is_json, url
    for method, url, body in ADMIN_WRITES:
        resp = getattr(visitor.client, method)(url, json=body, headers={"X-CSRFToken": visitor.csrf})
        assert resp.status_code == 401, (method, url)
    for url in ADMIN_PAGES:
        resp = app.test_client().get(url)
        assert resp.status_code == 302 and "/admin/login" in resp.headers["Location"], url
    assert versions(app) == {"v1-base": "active", "v2-ppo": "candidate", "v3-ppo": "failed"}


def test_admin_writes_need_the_csrf_token(setup):
    app, _ = setup
    admin = Admin(app)
    for method, url, body in ADMIN_WRITES:
        resp = getattr(admin.client, method)(url, json=body)
        assert resp.status_code == 400 and "CSRF" in resp.get_json()["error"], url
    assert versions(app) == {"v1-base": "active", "v2-ppo": "candidate", "v3-ppo": "failed"}
    with app.app_context():
        assert db.session.query(Experiment).count() == 0


def test_admin_pages_render(setup):
    app, _ = setup
    admin = Admin(app)
    assert admin.post("/api/admin/experiments", {"key": "x", "control_version_id": 1,
                                                 "variant_version_id": 2}).status_code == 201
    for url in ADMIN_PAGES[:-4] + ["/admin/versions", "/admin/settings", "/admin/feedback?thumb=up&q=rice"]:
        if url == "/admin/runs/1":
            continue
        resp = admin.get(url)
        assert resp.status_code == 200, url
        assert b"<h1>" in resp.data
    assert admin.get("/admin/runs/999").status_code == 404
    assert admin.get("/admin/feedback?rating=9").status_code == 400
