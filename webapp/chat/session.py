"""``GET /api/session`` (who the caller is, a CSRF token) and ``GET /api/health``.

Arms are blind: an end user is assigned an A/B arm here (the first exposure) but is never told
which, nor which model version answers them; only an admin sees the experiment, arm and version.
"""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify
from flask_login import current_user
from flask_wtf.csrf import generate_csrf

from webapp.core.display import mask_url
from webapp.core.identity import current_visitor, is_admin
from webapp.core.models import active_version
from webapp.experiments.assignment import assign, running_experiment
from webapp.serving.routing import backend_problem, serving_problems

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
    experiment, and a load error names paths and versions.

    With an inference server (``RLHF_INFERENCE_URL``) the status is ``degraded`` while it cannot
    be reached, and an admin also gets ``backend``: its URL and the problem (null when it answers)."""
    version = active_version()
    problem = next((p for p in serving_problems() if version and p["version"] == version.name), None)
    url = current_app.config.get("RLHF_INFERENCE_URL")
    unreachable = backend_problem() if url else None
    status = "degraded" if problem is not None or unreachable else "ok" if version else "no_model"
    if not is_admin():
        return jsonify(status=status)
    body = {"status": status, "model_version": version.name if version else None}
    if problem is not None:
        body.update(serving=problem["serving"], problem=problem["error"])
    if url:
        body["backend"] = {"kind": "inference_server", "url": mask_url(url), "problem": unreachable}
    return jsonify(body)
