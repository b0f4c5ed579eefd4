"""End-user accounts: register, sign in, change the password, sign out (``/api/account/...``, JSON,
CSRF like every write). Sessions themselves (revocation, the CSRF token at sign-in, usernames
compared one way everywhere, timing): webapp/core/signin.py.

Registering gives the caller's current anonymous identity a username and a password (hashed
with werkzeug), so everything they did so far stays theirs; signing in on another browser then
gives that account's conversations. A signed-in end user is an ordinary user: never an admin
(admins sign in at ``/admin/login``), never able to reach the admin pages or API.

An account is what makes a rater one person across browsers: the per-address limit on new
anonymous identities (RLHF_NEW_IDENTITIES_PER_HOUR) never applies to signing in, and registering
needs an identity, so accounts cannot be minted faster than identities.
"""
from __future__ import annotations

import re

from flask import Blueprint, current_app, jsonify, request
from flask_login import current_user
from sqlalchemy.exc import IntegrityError
from werkzeug.exceptions import BadRequest, Conflict, Forbidden, Unauthorized
from werkzeug.security import generate_password_hash

from webapp.core.extensions import db, limiter
from webapp.core.identity import current_visitor
from webapp.core.models import User
from webapp.core.security import address_key
from webapp.core.signin import (
    check_password,
    clean_username,
    end_all_sessions,
    find_user,
    keep_this_session,
    sign_in,
    sign_out,
    username_key,
)
from webapp.core.validation import json_body

bp = Blueprint("account_api", __name__, url_prefix="/api/account")

USERNAME_RULES = "3-32 characters: letters, digits, '.', '-' or '_', starting with a letter or digit"
_USERNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{2,31}")
MIN_PASSWORD, MAX_PASSWORD = 8, 200


def _limit() -> str:
    return current_app.config["RLHF_ACCOUNT_RATE_LIMIT"]


def _username_key() -> str:
    """The per-username limit's key: the client address with the body's username (sign-in,
    registration), else the signed-in account's (password change); one normalisation with the
    lookups (signin.username_key). Per address, never across addresses: that let anyone lock an
    account out with wrong passwords from elsewhere."""
    try:
        data = request.get_json(silent=True)
    except RecursionError:  # nested too deeply to parse: the view answers 400 for it
        data = None
    name = data.get("username") if isinstance(data, dict) else None
    if name is None and current_user.is_authenticated:
        name = current_user.username
    return f"account-user:{address_key()}|{username_key(name)[:64]}"


def account_limit(view):
    """Sign-in and registration attempts: per client address, and per username from one address."""
    by_address = limiter.shared_limit(_limit, scope="account-address", key_func=address_key,
                                      error_message="Too many sign-in attempts from your network address.")
    by_username = limiter.shared_limit(_limit, scope="account-user", key_func=_username_key,
                                       error_message="Too many sign-in attempts for this username.")
    return by_address(by_username(view))


def _username(data: dict) -> str:
    value = data.get("username")
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadRequest("'username' is required.")
    if not isinstance(value, str):
        raise BadRequest("'username' must be a string.")
    value = clean_username(value)
    if not _USERNAME.fullmatch(value):
        raise BadRequest(f"'username' must be {USERNAME_RULES}.")
    return value


def _password(data: dict, checking: bool = False, key: str = "password") -> str:
    value = data.get(key)
    if value is None or value == "":
        raise BadRequest(f"'{key}' is required.")
    if not isinstance(value, str):
        raise BadRequest(f"'{key}' must be a string.")
    if "\x00" in value:
        raise BadRequest(f"'{key}' must not contain NUL characters.")
    if len(value) > MAX_PASSWORD:
        raise BadRequest(f"'{key}' is too long (the limit is {MAX_PASSWORD} characters).")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON) cannot be hashed
        raise BadRequest(f"'{key}' must be valid Unicode text (it contains an unpaired surrogate).") from None
    if not checking and len(value) < MIN_PASSWORD:
        raise BadRequest(f"'{key}' must be at least {MIN_PASSWORD} characters.")
    return value


def account_dict(user: User, csrf_token: str | None = None) -> dict:
    body = {"user_id": user.id, "username": user.username, "signed_in": True}
    if csrf_token is not None:
        body["csrf_token"] = csrf_token  # signing in starts a new token; the old one no longer works
    return body


@bp.post("/register")
@account_limit
def register():
    """Attach a username and password to the caller's current (anonymous) identity."""
    data = json_body({"username", "password"})
    if current_user.is_authenticated:
        raise Conflict(f"You are already signed in as {current_user.username}. Sign out to create another account.")
    name = _username(data)
    password = _password(data)
    if find_user(name) is not None:
        raise Conflict("That username is taken; choose another one.")
    user = current_visitor()  # a first-time visitor gets an identity first (the per-address limit applies)
    user.username = name
    user.password_hash = generate_password_hash(password)
    user.anon_id = None  # an old copy of the anonymous cookie no longer opens the account
    try:
        db.session.commit()
    except IntegrityError:  # someone took the name a moment ago
        db.session.rollback()
        raise Conflict("That username is taken; choose another one.") from None
    return jsonify(account_dict(user, sign_in(user))), 201


@bp.post("/login")
@account_limit
def login():
    """Sign in to an end-user account (admins use /admin/login)."""
    data = json_body({"username", "password"})
    name = data.get("username")
    if name is None or (isinstance(name, str) and not name.strip()):
        raise BadRequest("'username' is required.")
    if not isinstance(name, str):
        raise BadRequest("'username' must be a string.")
    password = _password(data, checking=True)
    name = clean_username(name)
    user = find_user(name) if _USERNAME.fullmatch(name) else None  # no account has any other name
    if not check_password(user if user is not None and not user.is_admin else None, password):
        raise Unauthorized("Wrong username or password.")
    return jsonify(account_dict(user, sign_in(user)))


@bp.post("/password")
@account_limit
def change_password():
    """``{password, new_password}``: a signed-in end user's new password. Every other session of the
    account ends; this one stays signed in."""
    data = json_body({"password", "new_password"})
    if not current_user.is_authenticated:
        raise Unauthorized("Sign in to change your password.")
    user = current_user._get_current_object()
    if user.is_admin:
        raise Forbidden("An admin's password is set with `flask --app webapp create-admin NAME`.")
    current = _password(data, checking=True)
    new = _password(data, key="new_password")
    if not check_password(user, current):
        raise Forbidden("'password' is not your current password.")
    user.password_hash = generate_password_hash(new)
    end_all_sessions(user)
    db.session.commit()
    keep_this_session(user)
    return jsonify(account_dict(user))


@bp.post("/logout")
def logout():
    """Sign out: the account's sessions end in every browser, and this one starts over as a new
    anonymous visitor. A caller who is not signed in keeps their anonymous identity: nothing happens."""
    return jsonify(signed_out=sign_out())
