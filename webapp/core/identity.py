"""Who is calling: anonymous visitors by a signed session cookie; signed-in users (end users
with an account, and admins) through Flask-Login.

A new anonymous identity is recorded with where it came from (``identity_origins``: a hash of
the client address salted with the secret key) and counts against the per-address limit on new
identities (``RLHF_NEW_IDENTITIES_PER_HOUR``, webapp/core/security.py): one person cannot mint
an army of fresh raters by clearing cookies. Existing identities are never affected.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime

from flask import Flask, current_app, g, has_request_context, request, session
from flask.sessions import SecureCookieSessionInterface, SessionMixin
from flask_limiter.util import get_remote_address
from flask_login import current_user

from webapp.core.extensions import db, login_manager
from webapp.core.models import IdentityOrigin, User
from webapp.core.security import check_new_identity_limit
from webapp.core.signin import admin_session_end, load_user


class RefreshOnPageLoadSessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, with the cookie's expiry (PERMANENT_SESSION_LIFETIME)
    renewed on reads (GET/HEAD: page loads, ``/api/session``) rather than on every response.
    Re-signing an unchanged cookie on every rating or message was the largest single cost of
    a feedback request (~0.25 ms of ~1 ms); a visitor who comes back within the lifetime loads
    a page and gets a fresh expiry all the same. A changed session is always saved. An admin's
    cookie expires when the session would end anyway (idle or too old: webapp/core/signin.py)."""

    def get_expiration_time(self, app: Flask, session: SessionMixin) -> datetime | None:
        expires = super().get_expiration_time(app, session)
        end = admin_session_end(app, session)
        return min(expires, end) if expires is not None and end is not None else expires

    def save_session(self, app: Flask, session: SessionMixin, response) -> None:
        if g.get("stateless"):  # see mark_stateless
            return
        super().save_session(app, session, response)

    def should_set_cookie(self, app: Flask, session: SessionMixin) -> bool:
        if session.modified:
            return True
        return (session.permanent and app.config["SESSION_REFRESH_EACH_REQUEST"]
                and request.method in ("GET", "HEAD"))


def init_app(app: Flask) -> None:
    app.session_interface = RefreshOnPageLoadSessionInterface()
    login_manager.user_loader(load_user)  # checks the session's generation (and an admin's lifetime)


def mark_stateless() -> None:
    """This request is authenticated otherwise (a bearer key): it never sets, refreshes or clears a
    cookie, whatever cookie the client sent."""
    g.stateless = True


_BY_ANON_ID = db.select(User).where(User.anon_id == db.bindparam("anon_id"))  # built once: runs on every request


def address_hash(address: str) -> str:
    """A client address as stored: HMAC-SHA256 keyed with the secret key (never the address)."""
    key = str(current_app.config["SECRET_KEY"]).encode()
    return hmac.new(key, address.encode(), hashlib.sha256).hexdigest()


def _api_digest(client: str, name: str) -> str:
    return "api-" + hashlib.sha256(f"{client}\0{name}".encode("utf-8", "surrogatepass")).hexdigest()[:56]


# A key's own identity (a request that names no end user) is the digest of "key:<id>" under the
# key's client -- the very digest an end user *named* "key:<id>" used to get, so a front end could
# forward ``user: "key:7"`` and act as key 7's own user. Identities are stored (``users.anon_id``)
# and both derivations already have users, conversations, feedback and A/B arms, so neither can
# change without orphaning them: instead the one colliding form of an end user's id is escaped
# (a NUL before it, which no end user's id can hold: webapp/openai_api/users.py refuses NUL), and every
# other id keeps its digest.
_KEY_IDENTITY = re.compile(r"key:[0-9]+")


def api_anon_id(client: str, external_id: str) -> str:
    """The ``users.anon_id`` of an end user of the /v1 API: one per (front end, its user id), so
    the same person through any key of one client is one user (webapp/openai_api/users.py), and the Open
    WebUI import finds them again (webapp/training/openwebui.py). Never a key's own identity."""
    return _api_digest(client, "\0" + external_id if _KEY_IDENTITY.fullmatch(external_id) else external_id)


def api_key_anon_id(client: str, key_id: int) -> str:
    """The ``users.anon_id`` of a /v1 key's own user: requests that name no end user."""
    return _api_digest(client, f"key:{key_id}")


def current_visitor(create: bool = True) -> User | None:
    """The caller as a ``users`` row: the signed-in user (an admin, or an end user with an
    account), else the anonymous visitor named by the signed cookie (created on first use when
    ``create``; 429 when the client address created too many identities within the hour)."""
    if current_user.is_authenticated:
        return current_user._get_current_object()
    anon_id = session.get("anon_id")
    if anon_id:
        user = db.session.scalars(_BY_ANON_ID, {"anon_id": anon_id}).first()
        if user is not None:
            return user
    if not create:
        return None
    check_new_identity_limit()
    anon_id = secrets.token_urlsafe(24)
    user = User(anon_id=anon_id)
    db.session.add(user)
    db.session.flush()
    db.session.add(IdentityOrigin(user_id=user.id, address_hash=address_hash(get_remote_address())))
    db.session.commit()
    session["anon_id"] = anon_id
    session.permanent = True
    return user


def is_admin() -> bool:
    if not has_request_context():  # scheduler jobs and CLI commands act without a user
        return False
    return bool(current_user.is_authenticated and getattr(current_user, "is_admin", False))
