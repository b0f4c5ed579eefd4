"""Who is calling: anonymous visitors by a signed session cookie, admins through Flask-Login."""
from __future__ import annotations

import secrets

from flask import Flask, has_request_context, request, session
from flask.sessions import SecureCookieSessionInterface, SessionMixin
from flask_login import current_user

from webapp.core.extensions import db, login_manager
from webapp.core.models import User


class RefreshOnPageLoadSessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, with the cookie's expiry (PERMANENT_SESSION_LIFETIME)
    renewed on reads (GET/HEAD: page loads, ``/api/session``) rather than on every response.
    Re-signing an unchanged cookie on every rating or message was the largest single cost of
    a feedback request (~0.25 ms of ~1 ms); a visitor who comes back within the lifetime loads
    a page and gets a fresh expiry all the same. A changed session is always saved."""

    def should_set_cookie(self, app: Flask, session: SessionMixin) -> bool:
        if session.modified:
            return True
        return (session.permanent and app.config["SESSION_REFRESH_EACH_REQUEST"]
                and request.method in ("GET", "HEAD"))


def init_app(app: Flask) -> None:
    app.session_interface = RefreshOnPageLoadSessionInterface()

    @login_manager.user_loader
    def load_user(user_id: str) -> User | None:
        if not user_id.isdigit():
            return None
        user = db.session.get(User, int(user_id))
        return user if user is not None and user.is_admin else None


_BY_ANON_ID = db.select(User).where(User.anon_id == db.bindparam("anon_id"))  # built once: runs on every request


def current_visitor(create: bool = True) -> User | None:
    """The caller as a ``users`` row: the logged-in admin, else the anonymous visitor named by
    the signed cookie (created on first use when ``create``)."""
    if current_user.is_authenticated:
        return current_user._get_current_object()
    anon_id = session.get("anon_id")
    if anon_id:
        user = db.session.scalars(_BY_ANON_ID, {"anon_id": anon_id}).first()
        if user is not None:
            return user
    if not create:
        return None
    anon_id = secrets.token_urlsafe(24)
    user = User(anon_id=anon_id)
    db.session.add(user)
    db.session.commit()
    session["anon_id"] = anon_id
    session.permanent = True
    return user


def is_admin() -> bool:
    if not has_request_context():  # scheduler jobs and CLI commands act without a user
        return False
    return bool(current_user.is_authenticated and getattr(current_user, "is_admin", False))
