"""Admin accounts: hashed passwords, login/logout pages (rate-limited per address, and per name from
one address), failed sign-ins recorded for the overview, route guards; an admin signing a user out
everywhere. Sessions themselves (revocation, lifetimes): webapp/core/signin.py."""
from __future__ import annotations

import functools
import re
import sys
from datetime import timedelta
from typing import Callable

import click
from flask import Blueprint, current_app, flash, jsonify, redirect, render_template, request, url_for
from flask_limiter.util import get_remote_address
from flask_login import current_user
from sqlalchemy.exc import IntegrityError
from werkzeug.exceptions import BadRequest, NotFound
from werkzeug.security import generate_password_hash

from webapp.core.audit import audit
from webapp.core.extensions import db, limiter
from webapp.core.identity import is_admin
from webapp.core.models import SigninFailure, User, utcnow
from webapp.core.security import address_key
from webapp.core.signin import (
    check_password,
    clean_username,
    end_all_sessions,
    find_user,
    sign_in,
    sign_out,
    username_key,
)

bp = Blueprint("admin_auth", __name__, url_prefix="/admin")

MIN_PASSWORD = 8


def admin_api(view: Callable) -> Callable:
    """JSON routes: 401 when not logged in as an admin."""
    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        if not is_admin():
            return jsonify(error="Admin login required."), 401
        return view(*args, **kwargs)
    return wrapper


def admin_page(view: Callable) -> Callable:
    """Pages: redirect to the login page when not logged in as an admin."""
    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        if not is_admin():
            return redirect(url_for("admin_auth.login", next=request.path))
        return view(*args, **kwargs)
    return wrapper


# A same-site admin path (and query): no scheme or host, no control characters or spaces (a CR/LF
# would end up in the Location header), no "//" or "\\" that a browser could read as another host.
_NEXT = re.compile(r"/admin(?:[/?#][A-Za-z0-9._~!$&'()*+,;=:@%/?#-]*)?")
ADMIN_USERNAME = re.compile(r"[A-Za-z0-9._-]{1,80}")


def _safe_next(target: str | None) -> str:
    # only same-site paths: never redirect to another host after login
    if target and _NEXT.fullmatch(target) and "//" not in target:
        return target
    return url_for("admin_pages.overview")


# Sign-in attempts are limited per client address (whatever the name) and per name *from that
# address* -- never per name across addresses: that let anyone lock an admin out by sending wrong
# passwords for their name from elsewhere (the right password from a fresh address got a 429).
# Every attempt counts, right or wrong: counting only failures would be checked before the
# password and counted after it, so a burst of parallel guesses would all pass the check.

def _login_limit() -> str:
    return current_app.config["RLHF_LOGIN_RATE_LIMIT"]


def _login_address_limit() -> str:
    return current_app.config["RLHF_LOGIN_RATE_LIMIT_PER_ADDRESS"]


def _login_username_key() -> str:
    return f"{get_remote_address()}|{username_key(request.form.get('username') or '')[:80]}"


@bp.route("/login", methods=["GET", "POST"])
@limiter.limit(_login_address_limit, methods=["POST"], key_func=address_key, scope="login-address",
               error_message="Too many login attempts from your network address.")
@limiter.limit(_login_limit, methods=["POST"], key_func=_login_username_key,
               scope="login-user", error_message="Too many login attempts for this username.")
def login():
    if is_admin():
        return redirect(_safe_next(request.args.get("next")))
    error = None
    if request.method == "POST":
        username = clean_username(request.form.get("username") or "")
        password = request.form.get("password") or ""
        user = find_user(username) if ADMIN_USERNAME.fullmatch(username) else None
        if check_password(user if user is not None and user.is_admin else None, password):
            sign_in(user)
            return redirect(_safe_next(request.args.get("next")))
        record_failure(username)
        error = "Wrong username or password."
    return render_template("admin/login.html", error=error), (401 if error else 200)


# ---------------------------------------------------------------------------- failed sign-ins

FAILURES_KEPT = timedelta(days=7)


def record_failure(username: str) -> None:
    """Count a failed sign-in for (the name as compared, the client address); rows a week past their
    last failure are dropped on the way."""
    name, address, now = username_key(username)[:80], get_remote_address()[:64], utcnow()
    db.session.execute(db.delete(SigninFailure).where(SigninFailure.last_at < now - FAILURES_KEPT))
    where = (SigninFailure.username == name, SigninFailure.address == address)
    bump = db.update(SigninFailure).where(*where).values(failures=SigninFailure.failures + 1, last_at=now)
    if db.session.execute(bump).rowcount == 0:
        try:
            with db.session.begin_nested():
                db.session.add(SigninFailure(username=name, address=address, failures=1, first_at=now, last_at=now))
        except IntegrityError:  # the same name and address failed at the same moment in another request
            db.session.execute(bump)
    db.session.commit()


def recent_failures(limit: int = 20) -> list[SigninFailure]:
    """Failed sign-ins of the last week, the latest first (the overview's table)."""
    since = utcnow() - FAILURES_KEPT
    return list(db.session.scalars(db.select(SigninFailure).where(SigninFailure.last_at >= since)
                                   .order_by(SigninFailure.last_at.desc(), SigninFailure.id.desc()).limit(limit)))


@bp.post("/logout")
def logout():
    """Log out: this admin's sessions end on every device."""
    sign_out()
    flash("You are logged out.")
    return redirect(url_for("admin_auth.login"))


def sign_user_out_everywhere(user_id: int) -> dict:
    """``POST /api/admin/users/<id>/sign-out``: every session of that account ends (audit-logged).
    404 for an unknown user; 400 for an anonymous visitor (no account) and for the caller."""
    user = db.session.get(User, user_id)
    if user is None:
        raise NotFound("User not found.")
    if not (user.is_admin or user.password_hash):
        raise BadRequest("That user is an anonymous visitor without an account: there is no sign-in to end.")
    if user.id == current_user.id:
        raise BadRequest("Use Log out to end your own sessions.")
    end_all_sessions(user)
    audit("sign_out_everywhere", user.username or f"user {user.id}", user_id=user.id)
    db.session.commit()
    return {"user_id": user.id, "username": user.username, "signed_out": True}


# ---------------------------------------------------------------------------- CLI

def set_admin_password(username: str, password: str) -> tuple[User, bool]:
    """Create the admin (or reset its password, which ends its sessions). Returns (user, created)."""
    username = clean_username(username)
    if not ADMIN_USERNAME.fullmatch(username):
        raise click.ClickException("username must be 1-80 letters, digits, '.', '-' or '_'")
    if len(password) < MIN_PASSWORD:
        raise click.ClickException(f"password must be at least {MIN_PASSWORD} characters")
    user = find_user(username)
    if user is not None and not user.is_admin:  # an end user's account never becomes an admin's
        raise click.ClickException(f"{user.username!r} is an end user's account (names are compared ignoring case "
                                   "and surrounding spaces); choose another name for the admin")
    created = user is None
    if created:
        user = User(username=username)
        db.session.add(user)
    else:
        end_all_sessions(user)
    user.is_admin = True
    user.password_hash = generate_password_hash(password)
    db.session.commit()
    return user, created


@click.command("create-admin")
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input (first line).")
def create_admin_command(username: str, password_stdin: bool) -> None:
    """Create an admin account (or reset its password). The password is stored hashed."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    user, created = set_admin_password(username, password)
    click.echo(f"{'Created' if created else 'Updated'} admin {user.username!r}.")
