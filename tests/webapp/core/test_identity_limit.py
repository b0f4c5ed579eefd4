"""Sybil friction: one client address creates at most RLHF_NEW_IDENTITIES_PER_HOUR new anonymous
identities an hour (429 JSON with Retry-After beyond it); existing cookies and other addresses
are unaffected; the limit is off with the rate limits; behind RLHF_TRUSTED_PROXIES proxies the
address is the X-Forwarded-For one (werkzeug's ProxyFix), and never without it."""
from __future__ import annotations

import pytest

from tests.support.app import make_app
from webapp.core.extensions import db
from webapp.core.models import IdentityOrigin, User


def visit(app, address: str, forwarded: str | None = None, client=None):
    """A visitor's first API call (``client``: an existing one, else a new browser)."""
    client = client or app.test_client()
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    resp = client.get("/api/session", environ_base={"REMOTE_ADDR": address}, headers=headers)
    return client, resp


def counts(app) -> tuple[int, int]:
    with app.app_context():
        return (db.session.scalar(db.select(db.func.count()).select_from(User)),
                db.session.scalar(db.select(db.func.count()).select_from(IdentityOrigin)))


def test_the_next_new_identity_from_an_address_is_refused_within_the_hour(tmp_path):
    app = make_app(tmp_path / "instance", RLHF_NEW_IDENTITIES_PER_HOUR=3)
    first, resp = visit(app, "203.0.113.7")
    assert resp.status_code == 200
    first_id, token = resp.get_json()["user_id"], resp.get_json()["csrf_token"]
    for _ in range(2):
        assert visit(app, "203.0.113.7")[1].status_code == 200
    assert counts(app) == (3, 3)

    refusals = [visit(app, "203.0.113.7")[1],  # any call that would make a 4th identity
                app.test_client().get("/api/conversations", environ_base={"REMOTE_ADDR": "203.0.113.7"})]
    for refused in refusals:
        assert refused.status_code == 429, refused.get_data(as_text=True)
        assert refused.is_json
        error = refused.get_json()["error"]
        assert "Too many new visitors from your network address" in error and "3 per hour" in error
        assert "Sign in" in error and "try again in" in error
        assert 0 < int(refused.headers["Retry-After"]) <= 3600
    assert counts(app) == (3, 3)  # nothing was created

    # an existing identity is never affected: its cookie still works, reads and writes
    again = visit(app, "203.0.113.7", client=first)[1]
    assert again.status_code == 200 and again.get_json()["user_id"] == first_id
    made = first.post("/api/conversations", json={"title": "still mine"}, headers={"X-CSRFToken": token},
                      environ_base={"REMOTE_ADDR": "203.0.113.7"})
    assert made.status_code == 201
    # another address has its own allowance
    assert visit(app, "198.51.100.4")[1].status_code == 200
    # the address is stored as a keyed hash, never as it is
    with app.app_context():
        hashes = {o.address_hash for o in db.session.scalars(db.select(IdentityOrigin))}
    assert len(hashes) == 2 and all(len(h) == 64 and "203.0.113" not in h for h in hashes)


@pytest.mark.parametrize("settings", [{"RLHF_RATELIMIT_ENABLED": False}, {"RLHF_NEW_IDENTITIES_PER_HOUR": 0}],
                         ids=["rate-limits-off", "zero"])
def test_no_limit_when_switched_off(tmp_path, settings):
    app = make_app(tmp_path / "instance", **{"RLHF_NEW_IDENTITIES_PER_HOUR": 2, **settings})
    ids = {visit(app, "203.0.113.7")[1].get_json()["user_id"] for _ in range(6)}
    assert len(ids) == 6
    assert counts(app) == (6, 6)  # the origins are recorded all the same


def test_x_forwarded_for_counts_only_behind_a_configured_proxy(tmp_path):
    # without RLHF_TRUSTED_PROXIES the header is the client's to invent: it changes nothing
    app = make_app(tmp_path / "direct", RLHF_NEW_IDENTITIES_PER_HOUR=2)
    statuses = [visit(app, "10.0.0.9", forwarded=f"192.0.2.{i}")[1].status_code for i in range(3)]
    assert statuses == [200, 200, 429]

    # behind one proxy (10.0.0.9) each visitor is the address the proxy saw
    app = make_app(tmp_path / "proxied", RLHF_NEW_IDENTITIES_PER_HOUR=2, RLHF_TRUSTED_PROXIES=1)
    statuses = [visit(app, "10.0.0.9", forwarded="192.0.2.1")[1].status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert visit(app, "10.0.0.9", forwarded="192.0.2.2")[1].status_code == 200
    # a client that prepends its own X-Forwarded-For gains nothing: the proxy's entry (the last) counts
    assert visit(app, "10.0.0.9", forwarded="6.6.6.6, 192.0.2.1")[1].status_code == 429
    from webapp.core.identity import address_hash

    with app.test_request_context():
        expected = {address_hash("192.0.2.1"), address_hash("192.0.2.2")}
    with app.app_context():
        assert {o.address_hash for o in db.session.scalars(db.select(IdentityOrigin))} == expected


def test_trusted_proxies_is_range_checked(tmp_path):
    from webapp.core.settings import ConfigError

    with pytest.raises(ConfigError, match="RLHF_TRUSTED_PROXIES"):
        make_app(tmp_path / "instance", RLHF_TRUSTED_PROXIES=-1)
