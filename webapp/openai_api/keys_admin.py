"""The admin's API keys: the dashboard page (list, create -- the key shown once on the page that
answers the form --, revoke) and the admin JSON API (``GET``/``POST /api/admin/api-keys``,
``POST /api/admin/api-keys/<id>/revoke``). Admin login required; forms carry their CSRF token,
JSON writes the ``X-CSRFToken`` header; every creation and revocation is in the audit log."""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify, redirect, render_template, request, url_for
from flask_login import current_user
from werkzeug.exceptions import BadRequest, Conflict, NotFound

from webapp.admin.auth import admin_api, admin_page
from webapp.core.extensions import db
from webapp.core.models import ApiKey
from webapp.core.validation import bool_field, json_body
from webapp.openai_api.keys import KeyProblem, all_keys, create_api_key, key_dict, revoke_api_key

bp = Blueprint("api_keys", __name__)

NO_STORE = {"Cache-Control": "no-store"}  # a page or answer that shows a key is never cached


def _create(name: object, client: object, forwards: bool, rate_limit: object) -> tuple[ApiKey, str]:
    for field, value in (("name", name), ("client", client), ("rate_limit", rate_limit)):
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"'{field}' must be a string.")
    if not name:
        raise BadRequest("'name' is required: 1-80 printable characters.")
    try:
        return create_api_key(name, client or None, forwards, rate_limit or None, created_by=current_user.id)
    except KeyProblem as exc:
        db.session.rollback()
        raise (Conflict if "exists already" in str(exc) else BadRequest)(str(exc)) from None


def _key_or_404(key_id: int) -> ApiKey:
    row = db.session.get(ApiKey, key_id)
    if row is None:
        raise NotFound("API key not found.")
    return row


def _page(created: tuple[ApiKey, str] | None = None, error: str | None = None, status: int = 200,
          form: dict | None = None):
    body = render_template("admin/api_keys.html", keys=[key_dict(k) for k in all_keys()], error=error,
                           created=(key_dict(created[0]), created[1]) if created else None, form=form or {},
                           default_limit=current_app.config["RLHF_API_RATE_LIMIT"],
                           model_name=current_app.config["RLHF_API_MODEL_NAME"])
    return body, status, NO_STORE


@bp.get("/admin/api-keys")
@admin_page
def page():
    return _page()


@bp.post("/admin/api-keys")
@admin_page
def create_form():
    form = {k: request.form.get(k, "").strip() for k in ("name", "client", "rate_limit")}
    form["forwards_user_headers"] = request.form.get("forwards_user_headers") == "1"
    try:
        created = _create(form["name"], form["client"], form["forwards_user_headers"], form["rate_limit"])
    except (BadRequest, Conflict) as exc:
        return _page(error=exc.description, status=exc.code or 400, form=form)
    return _page(created=created)


@bp.post("/admin/api-keys/<int:key_id>/revoke")
@admin_page
def revoke_form(key_id: int):
    revoke_api_key(_key_or_404(key_id))
    return redirect(url_for("api_keys.page"), 303)


@bp.get("/api/admin/api-keys")
@admin_api
def list_keys():
    return jsonify(keys=[key_dict(k) for k in all_keys()])


@bp.post("/api/admin/api-keys")
@admin_api
def create_key():
    """201 ``{key, api_key}``: ``key`` is the API key itself, in this answer only."""
    data = json_body({"name", "client", "forwards_user_headers", "rate_limit"})
    row, key = _create(data.get("name"), data.get("client"), bool_field(data, "forwards_user_headers", False),
                       data.get("rate_limit"))
    return jsonify(key=key, api_key=key_dict(row)), 201, NO_STORE


@bp.post("/api/admin/api-keys/<int:key_id>/revoke")
@admin_api
def revoke_key(key_id: int):
    """Revoke a key (refused from the next request on, by every process); revoking it again changes nothing."""
    row = _key_or_404(key_id)
    revoke_api_key(row)
    return jsonify(api_key=key_dict(row))
