"""Sign-in and the sessions it opens, for admins and end users alike.

* One normalisation of usernames (:func:`username_key`: NFKC, surrounding whitespace dropped,
  lower case) for rate limits, lookups and uniqueness, so ``" Root"`` and ``"root"`` are one
  name everywhere.
* A password check costs one hash whether or not the name exists (:func:`check_password`),
  so the answer's timing does not tell which names have accounts.
* Sessions the server can end: a signed-in cookie carries the user's ``session_generation``
  from the database at sign-in. Signing out, a password change and an admin's "sign out
  everywhere" bump it (:func:`end_all_sessions`); a cookie with an older generation is
  anonymous on its next request, in every process (the check reads the database).
* Admin sessions also end ``RLHF_ADMIN_SESSION_IDLE_HOURS`` after their last request and
  ``RLHF_ADMIN_SESSION_MAX_HOURS`` after sign-in, and their cookie expires then too. End users'
  sessions last until they sign out (the cookie itself, PERMANENT_SESSION_LIFETIME from the
  last page load).
* Signing in starts a fresh CSRF token.
"""
from __future__ import annotations

import functools
import secrets
import time
import unicodedata
from datetime import datetime, timezone

from flask import Flask, current_app, g, session
from flask.sessions import SessionMixin
from flask_login import current_user, login_user, logout_user
from flask_wtf.csrf import generate_csrf
from werkzeug.security import check_password_hash, generate_password_hash

from webapp.core.extensions import db
from webapp.core.models import User

# Session keys next to Flask-Login's: the generation signed in with, when, and (admins) the last request.
GENERATION, SIGNED_IN_AT, SEEN_AT = "_gen", "_signed_in_at", "_seen_at"
_LOGIN_KEYS = ("_user_id", "_fresh", "_id", "_remember", "_remember_seconds", GENERATION, SIGNED_IN_AT, SEEN_AT)
# An admin's last request is written into the cookie at most once a minute (not every request).
SEEN_RESOLUTION_SECONDS = 60


# ---------------------------------------------------------------------------- usernames

def clean_username(raw: str) -> str:
    """A username as typed, normalised for storage and display (case kept)."""
    return unicodedata.normalize("NFKC", raw).strip()


def username_key(raw: object) -> str:
    """The one comparison form of a username (rate limits, lookups, uniqueness); "" for a non-string."""
    return clean_username(raw).lower() if isinstance(raw, str) else ""


def find_user(name: str) -> User | None:
    """The user whose name has the same :func:`username_key` as ``name``."""
    key = username_key(name)
    if not key:
        return None
    return db.session.scalars(db.select(User).where(db.func.lower(User.username) == key)).first()


# ---------------------------------------------------------------------------- passwords

@functools.cache
def _dummy_hash() -> str:
    # a hash made like every real one (werkzeug's default method), of a password nobody knows
    return generate_password_hash(secrets.token_urlsafe(24))


def check_password(user: User | None, password: str) -> bool:
    """Whether ``user`` (None: no such account, or one that may not sign in here) has ``password``.
    Exactly one hash is checked either way, so a missing name takes as long as a wrong password."""
    stored = user.password_hash if user is not None else None
    matches = check_password_hash(stored or _dummy_hash(), password)
    return bool(stored) and matches


# ---------------------------------------------------------------------------- signing in and out

def rotate_csrf_token() -> str:
    """A new CSRF token for the session (the old one stops working); returns the new token."""
    field = current_app.config.get("WTF_CSRF_FIELD_NAME", "csrf_token")
    session.pop(field, None)
    g.pop(field, None)  # generate_csrf caches the request's token here
    return generate_csrf()


def sign_in(user: User) -> str:
    """Sign ``user`` in on this browser; returns the new CSRF token."""
    session.pop("anon_id", None)  # the account is reached by signing in from now on
    login_user(user)
    now = int(time.time())
    session[GENERATION] = user.session_generation
    session[SIGNED_IN_AT] = now
    if user.is_admin:
        session[SEEN_AT] = now
    else:
        session.pop(SEEN_AT, None)
    session.permanent = True
    return rotate_csrf_token()


def end_all_sessions(user: User) -> None:
    """Every session of ``user`` ends (on its next request, in any process); the caller commits."""
    user.session_generation = User.session_generation + 1  # in SQL: concurrent bumps both count


def sign_out() -> bool:
    """End the caller's session -- and with it every other session of the account. False when
    nobody was signed in (the session, an anonymous visitor's, is left as it is)."""
    if not current_user.is_authenticated:
        return False
    end_all_sessions(current_user._get_current_object())
    db.session.commit()
    logout_user()
    session.clear()
    return True


def keep_this_session(user: User) -> None:
    """After ``end_all_sessions(user)`` and its commit: this browser's session stays signed in."""
    session[GENERATION] = user.session_generation


def _forget() -> None:
    for key in _LOGIN_KEYS:
        session.pop(key, None)


def _admin_limits(app: Flask) -> tuple[float, float]:
    return (float(app.config["RLHF_ADMIN_SESSION_IDLE_HOURS"]) * 3600,
            float(app.config["RLHF_ADMIN_SESSION_MAX_HOURS"]) * 3600)


def _valid(user: User) -> bool:
    if session.get(GENERATION) != user.session_generation:
        return False
    if not user.is_admin:
        return True
    signed_in_at, seen_at = session.get(SIGNED_IN_AT), session.get(SEEN_AT)
    if not isinstance(signed_in_at, int) or not isinstance(seen_at, int):
        return False
    idle, lifetime = _admin_limits(current_app)
    now = time.time()
    if now - signed_in_at > lifetime or now - seen_at > idle:
        return False
    if now - seen_at >= SEEN_RESOLUTION_SECONDS:
        session[SEEN_AT] = int(now)
    return True


def load_user(user_id: str) -> User | None:
    """Flask-Login's user loader: the signed-in user of this session, or None (anonymous) when the
    session was ended (an older generation) or, for an admin, is idle or too old. Such a session
    forgets its sign-in, so the browser goes on as a new anonymous visitor."""
    user = db.session.get(User, int(user_id)) if user_id.isdigit() else None
    # admins, and end users who registered an account (a password); never a bare anonymous row
    if user is None or not (user.is_admin or user.password_hash) or not _valid(user):
        _forget()
        return None
    return user


def admin_session_end(app: Flask, sess: SessionMixin) -> datetime | None:
    """When an admin's session ends unless it is used again (its cookie expires then too); None
    for other sessions."""
    signed_in_at, seen_at = sess.get(SIGNED_IN_AT), sess.get(SEEN_AT)
    if not isinstance(signed_in_at, int) or not isinstance(seen_at, int):
        return None
    idle, lifetime = _admin_limits(app)
    return datetime.fromtimestamp(min(signed_in_at + lifetime, seen_at + idle), timezone.utc)
