"""``GET /api/session``: who the caller is, a CSRF token, and their A/B arm."""
from __future__ import annotations

from flask import Blueprint, jsonify
from flask_wtf.csrf import generate_csrf

from ..auth import current_visitor, is_admin
from ..bootstrap import active_version

bp = Blueprint("session_api", __name__, url_prefix="/api")


@bp.get("/session")
def get_session():
    user = current_visitor()
    version = active_version()
    return jsonify(user_id=user.id, csrf_token=generate_csrf(), experiment=None, arm=None,
                   model_version=version.name if version else None, is_admin=is_admin())


@bp.get("/health")
def health():
    version = active_version()
    return jsonify(status="ok" if version else "no_model", model_version=version.name if version else None)
