"""Anonymous sessions, CSRF tokens and JSON errors."""
from __future__ import annotations

from tests.support.feedback_factory import add_exchange
from webapp.core.extensions import db
from webapp.core.models import User


def test_new_visitor_gets_a_user_and_a_signed_cookie(app, client):
    resp = client.get("/api/session")
    assert resp.status_code == 200
    data = resp.get_json()
    # blind arms: no experiment, arm or model version for a visitor
    assert set(data) == {"user_id", "csrf_token", "is_admin", "compare_rate", "username"}
    assert data["is_admin"] is False and data["csrf_token"] and data["compare_rate"] == 0.0
    assert data["username"] is None  # anonymous: no account
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    with app.app_context():
        assert db.session.get(User, data["user_id"]).anon_id

    again = client.get("/api/session").get_json()
    assert again["user_id"] == data["user_id"]  # same cookie, same user


def test_cookie_expiry_is_renewed_on_page_loads_not_on_every_write(app, client):
    """Re-signing an unchanged session cookie on every rating cost ~0.25 ms a request: writes
    leave the cookie alone, reads (the page and /api/session load on every visit) renew it."""
    data = client.get("/api/session").get_json()
    with app.app_context():
        answer_id = add_exchange(data["user_id"], "q", ["a"])[1][0].id
        db.session.commit()
    headers = {"X-CSRFToken": data["csrf_token"]}
    first = client.post(f"/api/messages/{answer_id}/feedback", json={"thumb": "up"}, headers=headers)
    assert first.status_code == 200
    for _ in range(3):
        resp = client.post(f"/api/messages/{answer_id}/feedback", json={"rating": 4}, headers=headers)
        assert resp.status_code == 200
        assert "Set-Cookie" not in resp.headers
    renewed = client.get("/api/session")
    assert "Expires=" in renewed.headers["Set-Cookie"]
    assert renewed.get_json()["user_id"] == data["user_id"]


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


def test_health_tells_visitors_the_status_only(client):
    """The active version is the control arm of a running experiment: only admins are told its
    name (tests/webapp/experiments/test_blind_arms.py)."""
    assert client.get("/api/health").get_json() == {"status": "ok"}
