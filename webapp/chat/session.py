"""``GET /api/session``: who the caller is, a CSRF token, and their A/B arm."""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify
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
    return jsonify(user_id=user.id, csrf_token=generate_csrf(), experiment=experiment.key if experiment else None,
                   arm=arm, model_version=version.name if version else None, is_admin=is_admin(),
                   compare_rate=compare_rate)


@bp.get("/health")
def health():
    """``ok`` (or ``no_model``); ``degraded`` while the active version cannot be loaded and a
    fallback answers in its place (``serving``: the fallback, or null when nothing can)."""
    version = active_version()
    problem = next((p for p in serving_problems() if version and p["version"] == version.name), None)
    if problem is not None:
        return jsonify(status="degraded", model_version=version.name, serving=problem["serving"],
                       problem=problem["error"])
    return jsonify(status="ok" if version else "no_model", model_version=version.name if version else None)
