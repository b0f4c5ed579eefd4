"""Anonymous sessions, CSRF tokens and JSON errors."""
from __future__ import annotations

from webapp.extensions import db
from webapp.models import User


def test_new_visitor_gets_a_user_and_a_signed_cookie(app, client):
    resp = client.get("/api/session")
    assert resp.status_code == 200
    data = resp.get_json()
    assert set(data) >= {"user_id", "csrf_token", "experiment", "arm", "is_admin"}
    assert data["is_admin"] is False and data["csrf_token"]
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    with app.app_context():
        assert db.session.get(User, data["user_id"]).anon_id

    again = client.get("/api/session").get_json()
    assert again["user_id"] == data["user_id"]  # same cookie, same user


def test_different_browsers_are_different_users(app):
    a = app.test_client().get("/api/session").get_json()
    b = app.test_client().get("/api/session").get_json()
    assert a["user_id"] != b["user_id"]


def test_tampered_cookie_is_a_new_visitor(app):
    c = app.test_client()
    first = c.get("/api/session").get_json()
    c.set_cookie("session", "forged.value.sig")
    second = c.get("/api/session").get_json()
    assert second["user_id"] != first["user_id"]


def test_unknown_api_route_is_json_404(client):
    resp = client.get("/api/does-not-exist")
    assert resp.status_code == 404
    assert resp.is_json and "error" in resp.get_json()


def test_wrong_method_is_json_405_with_allow_header(client):
    resp = client.delete("/api/session")
    assert resp.status_code in (400, 405)  # CSRF is checked before routing for unsafe methods
    assert resp.is_json and resp.get_json()["error"]


def test_health_names_the_active_version(client):
    data = client.get("/api/health").get_json()
    assert data == {"status": "ok", "model_version": "v1-base"}
