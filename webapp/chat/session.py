"""``GET /api/session`` (who the caller is, a CSRF token) and ``GET /api/health``.

Arms are blind: an end user is assigned an A/B arm here (the first exposure) but is never told
which, nor which model version answers them; only an admin sees the experiment, arm and version.
"""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from flask_login import current_user
from flask_wtf.csrf import generate_csrf

from webapp.core.identity import current_visitor, is_admin
from webapp.core.models import active_version
from webapp.experiments.assignment import assign, running_experiment
from webapp.serving.routing import serving_problems

bp = Blueprint("session_api", __name__, url_prefix="/api")


@bp.get("/session")
def get_session():
    user = current_visitor()
    experiment = running_experiment()
    if experiment is not None:
        arm = assign(experiment, user)
        version = experiment.variant_version if arm == "variant" else experiment.control_version
    else:
        arm, version = None, active_version()
    # While an experiment runs, a share of questions is answered side by side (control vs variant).
    compare_rate = float(current_app.config["RLHF_COMPARE_RATE"]) if experiment is not None else 0.0
    body = {"user_id": user.id, "csrf_token": generate_csrf(), "is_admin": is_admin(), "compare_rate": compare_rate,
            "username": user.username if current_user.is_authenticated else None}  # null: an anonymous visitor
    if body["is_admin"]:
        body.update(experiment=experiment.key if experiment else None, arm=arm,
                    model_version=version.name if version else None)
    return jsonify(body)


@bp.get("/health")
def health():
    """``ok`` (or ``no_model``); ``degraded`` while the active version cannot be loaded and a
    fallback answers in its place. Only an admin is told which: ``model_version`` (the active
    one), and when degraded ``serving`` (the fallback, or null when nothing can) and ``problem``.
    Everyone else gets the status alone -- the active version is the control arm of a running
    experiment, and a load error names paths and versions."""
    version = active_version()
    problem = next((p for p in serving_problems() if version and p["version"] == version.name), None)
    status = "degraded" if problem is not None else "ok" if version else "no_model"
    if not is_admin():
        return jsonify(status=status)
    if problem is not None:
        return jsonify(status=status, model_version=version.name, serving=problem["serving"],
                       problem=problem["error"])
    return jsonify(status=status, model_version=version.name if version else None)
