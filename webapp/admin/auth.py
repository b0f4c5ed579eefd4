"""Admin accounts: hashed passwords, login/logout pages (rate-limited), route guards."""
from __future__ import annotations

import functools
import sys
from typing import Callable

import click
from flask import Blueprint, current_app, flash, jsonify, redirect, render_template, request, session, url_for
from flask_login import login_user, logout_user
from werkzeug.security import check_password_hash, generate_password_hash

from webapp.core.extensions import db, limiter
from webapp.core.identity import is_admin
from webapp.core.models import User

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


def _safe_next(target: str | None) -> str:
    # only same-site paths: never redirect to another host after login
    if target and target.startswith("/admin") and "//" not in target and "\\" not in target:
        return target
    return url_for("admin_pages.overview")


def _login_limit() -> str:
    return current_app.config["RLHF_LOGIN_RATE_LIMIT"]


@bp.route("/login", methods=["GET", "POST"])
@limiter.limit(_login_limit, methods=["POST"], error_message="Too many login attempts from your network address.")
@limiter.limit(_login_limit, methods=["POST"], key_func=lambda: (request.form.get("username") or "").lower(),
               scope="login-user", error_message="Too many login attempts for this username.")
def login():
    if is_admin():
        return redirect(_safe_next(request.args.get("next")))
    error = None
    if request.method == "POST":
        username = (request.form.get("username") or "").strip()
        password = request.form.get("password") or ""
        user = db.session.scalars(db.select(User).filter_by(username=username, is_admin=True)).first() \
            if username else None
        if user is not None and user.password_hash and check_password_hash(user.password_hash, password):
            session.pop("anon_id", None)  # the admin is no longer the anonymous visitor
            login_user(user)
            session.permanent = True
            return redirect(_safe_next(request.args.get("next")))
        error = "Wrong username or password."
    return render_template("admin/login.html", error=error), (401 if error else 200)


@bp.post("/logout")
def logout():
    logout_user()
    session.clear()
    flash("You are logged out.")
    return redirect(url_for("admin_auth.login"))


# ---------------------------------------------------------------------------- CLI

def set_admin_password(username: str, password: str) -> tuple[User, bool]:
    """Create the admin (or reset its password). Returns (user, created)."""
    if not username or len(username) > 80 or not username.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise click.ClickException("username must be 1-80 letters, digits, '.', '-' or '_'")
    if len(password) < MIN_PASSWORD:
        raise click.ClickException(f"password must be at least {MIN_PASSWORD} characters")
    user = db.session.scalars(db.select(User).filter_by(username=username)).first()
    created = user is None
    if created:
        user = User(username=username)
        db.session.add(user)
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
