"""Ending a session holds across processes: two production servers (``flask serve``) on one
instance folder and database, as two workers behind a load balancer would be. A cookie copied from
one is refused by the other once its owner signs out, changes the password, or an admin's password
is reset with ``flask create-admin`` (a third process)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import requests

from tests.support.app import make_app, register_model
from tests.support.live_server import ROOT, LiveServer
from webapp.admin.auth import set_admin_password
from webapp.core.extensions import db

ADMIN_PASSWORD = "live admin password"
PASSWORD = "live member password"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, micro_model_dir):
    instance = tmp_path_factory.mktemp("sessions-live") / "instance"
    app = make_app(instance)
    register_model(app, micro_model_dir)
    with app.app_context():
        set_admin_password("secadmin", ADMIN_PASSWORD)
        db.engine.dispose()
    first = LiveServer(instance)
    try:
        second = LiveServer(instance)
    except Exception:
        first.stop()
        raise
    yield first, second, instance
    first.stop()
    second.stop()


def admin_session(server) -> requests.Session:
    s = requests.Session()
    token = re.search(r'name="csrf_token" value="([^"]+)"', s.get(server.url + "/admin/login").text).group(1)
    resp = s.post(server.url + "/admin/login", data={"username": "secadmin", "password": ADMIN_PASSWORD,
                                                     "csrf_token": token}, allow_redirects=False)
    assert resp.status_code == 302, resp.text[:300]
    return s


def member_session(server, path: str, username: str, password: str = PASSWORD) -> requests.Session:
    s = requests.Session()
    token = s.get(server.url + "/api/session").json()["csrf_token"]
    resp = s.post(server.url + path, json={"username": username, "password": password},
                  headers={"X-CSRFToken": token})
    assert resp.status_code in (200, 201), resp.text
    s.headers["X-CSRFToken"] = resp.json().get("csrf_token", token)  # a new one at sign-in
    return s


def with_cookie(server, cookie: str, path: str) -> requests.Response:
    """A request carrying only a copied session cookie (another client, another process)."""
    return requests.get(server.url + path, cookies={"session": cookie}, timeout=30)


def test_admin_logout_on_one_server_ends_the_cookie_on_the_other(servers):
    first, second, _ = servers
    admin = admin_session(first)
    copied = admin.cookies["session"]
    assert with_cookie(second, copied, "/api/admin/audit").status_code == 200
    token = admin.get(first.url + "/api/session").json()["csrf_token"]
    assert admin.post(first.url + "/admin/logout", data={"csrf_token": token}, allow_redirects=False).status_code == 302
    assert with_cookie(second, copied, "/api/admin/audit").status_code == 401
    assert with_cookie(second, copied, "/api/session").json()["is_admin"] is False
    assert with_cookie(first, copied, "/api/admin/audit").status_code == 401


def test_create_admin_in_another_process_ends_the_admins_sessions(servers):
    first, second, instance = servers
    copied = admin_session(first).cookies["session"]
    assert with_cookie(second, copied, "/api/session").json()["is_admin"] is True
    env = {**os.environ, "RLHF_INSTANCE_DIR": str(instance)}
    result = subprocess.run([sys.executable, "-m", "flask", "--app", "webapp", "create-admin", "secadmin",
                             "--password-stdin"], input=ADMIN_PASSWORD + "\n", capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0 and "Updated admin 'secadmin'" in result.stdout, result.stdout + result.stderr
    for server in (first, second):
        assert with_cookie(server, copied, "/api/session").json()["is_admin"] is False
        assert with_cookie(server, copied, "/api/admin/audit").status_code == 401
    assert admin_session(second).get(second.url + "/api/admin/audit").status_code == 200  # signing in again works


def test_end_user_sign_out_on_one_server_ends_the_cookie_on_the_other(servers):
    first, second, _ = servers
    member = member_session(first, "/api/account/register", "live_member")
    assert member.post(first.url + "/api/conversations", json={"title": "mine"}).status_code == 201
    copied = member.cookies["session"]
    stolen = with_cookie(second, copied, "/api/session").json()
    assert stolen["username"] == "live_member"
    assert [c["title"] for c in with_cookie(second, copied, "/api/conversations").json()["conversations"]] == ["mine"]
    assert member.post(first.url + "/api/account/logout").json() == {"signed_out": True}
    after = with_cookie(second, copied, "/api/session").json()
    assert after["username"] is None and after["user_id"] != stolen["user_id"]
    assert with_cookie(second, copied, "/api/conversations").json()["conversations"] == []


def test_end_user_password_change_on_one_server_ends_the_other_sessions(servers):
    first, second, _ = servers
    laptop = member_session(first, "/api/account/register", "live_changer")
    phone = member_session(second, "/api/account/login", "live_changer")
    copied = laptop.cookies["session"]
    resp = phone.post(second.url + "/api/account/password", json={"password": PASSWORD,
                                                                  "new_password": "another live password"})
    assert resp.status_code == 200, resp.text
    for server in (first, second):
        assert with_cookie(server, copied, "/api/session").json()["username"] is None
    # the phone's own session goes on, on either server
    assert phone.get(first.url + "/api/session").json()["username"] == "live_changer"
    assert phone.post(first.url + "/api/conversations", json={}).status_code == 201
