"""Admin JSON API: metrics, experiments, versions, training runs, feedback, export.
Everything here answers 401 without an admin login; state changes also need the CSRF token."""
from __future__ import annotations

import json

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import BadRequest, Conflict, NotFound

from rlhf.algorithms import ALGORITHMS
from webapp.admin.auth import admin_api, sign_user_out_everywhere
from webapp.admin.feedback_browser import feedback_page
from webapp.admin.raters import change_trust, rater_page
from webapp.admin.runs import run_dict, run_or_404
from webapp.core.display import display_paths
from webapp.core.extensions import db
from webapp.core.models import AuditEvent, Experiment, ModelVersion, TrainingRun, active_version
from webapp.core.settings import current_settings
from webapp.core.validation import bool_field, json_body
from webapp.experiments.lifecycle import (
    conclude_experiment,
    create_experiment,
    get_experiment,
    promote_version,
    rollback_version,
    set_split,
    start_experiment,
    stop_experiment,
)
from webapp.experiments.metrics import default_experiment, experiment_dict, experiment_metrics
from webapp.training.curves import run_curves
from webapp.training.jobs import training_in_progress
from webapp.training.model_size import sized_setting
from webapp.training.records import EXPORT_FORMATS, export_rows, feedback_event_count
from webapp.training.runs import spawn_training

bp = Blueprint("admin_api", __name__, url_prefix="/api/admin")


# ---------------------------------------------------------------------------- metrics & experiments

@bp.get("/metrics")
@admin_api
def metrics():
    key = request.args.get("experiment")
    exp = get_experiment(key) if key else default_experiment()
    if exp is None:
        raise NotFound("There are no experiments yet.")
    return jsonify(experiment_metrics(exp))


@bp.get("/experiments")
@admin_api
def list_experiments():
    exps = db.session.scalars(db.select(Experiment).order_by(Experiment.id.desc())).all()
    return jsonify(experiments=[experiment_dict(e) for e in exps])


@bp.post("/experiments")
@admin_api
def post_experiment():
    data = json_body({"key", "control_version_id", "variant_version_id", "traffic_split", "start"})
    for field in ("key", "control_version_id", "variant_version_id"):
        if field not in data:
            raise BadRequest(f"'{field}' is required.")
    exp = create_experiment(data["key"], data["control_version_id"], data["variant_version_id"],
                            data.get("traffic_split", 0.5), bool_field(data, "start", True))
    return jsonify(experiment_dict(exp)), 201


@bp.patch("/experiments/<key>")
@admin_api
def patch_experiment(key: str):
    data = json_body({"traffic_split"})
    if "traffic_split" not in data:
        raise BadRequest("'traffic_split' is required.")
    return jsonify(experiment_dict(set_split(key, data["traffic_split"])))


@bp.post("/experiments/<key>/start")
@admin_api
def post_start(key: str):
    """A draft (created with ``start: false``) starts; 409 when another experiment runs."""
    return jsonify(experiment_dict(start_experiment(key)))


@bp.post("/experiments/<key>/stop")
@admin_api
def post_stop(key: str):
    return jsonify(experiment_dict(stop_experiment(key)))


@bp.post("/experiments/<key>/conclude")
@admin_api
def post_conclude(key: str):
    data = json_body({"decision"})
    exp = get_experiment(key)
    snapshot = {m["name"]: {**m["comparison"], "sequential": m["sequential"]}
                for m in experiment_metrics(exp)["metrics"]}
    return jsonify(experiment_dict(conclude_experiment(key, data.get("decision"), {"metrics": snapshot})))


# ---------------------------------------------------------------------------- versions

@bp.get("/versions")
@admin_api
def list_versions():
    versions = db.session.scalars(db.select(ModelVersion).order_by(ModelVersion.id.desc())).all()
    active = active_version()
    return jsonify(versions=[display_paths(v.to_dict()) | {"parent": v.parent.name if v.parent else None}
                             for v in versions], active=active.name if active else None)


@bp.post("/versions/<int:version_id>/promote")
@admin_api
def post_promote(version_id: int):
    return jsonify(version=display_paths(promote_version(version_id).to_dict()))


@bp.post("/versions/<int:version_id>/rollback")
@admin_api
def post_rollback(version_id: int):
    target = rollback_version(version_id)
    return jsonify(active=display_paths(target.to_dict()))


# ---------------------------------------------------------------------------- training runs

@bp.get("/runs")
@admin_api
def list_runs():
    runs = db.session.scalars(db.select(TrainingRun).order_by(TrainingRun.id.desc()).limit(100)).all()
    return jsonify(runs=[run_dict(r) for r in runs])


@bp.get("/runs/<int:run_id>")
@admin_api
def get_run(run_id: int):
    return jsonify(run_dict(run_or_404(run_id), full=True))


@bp.get("/runs/<int:run_id>/curves")
@admin_api
def get_run_curves(run_id: int):
    """The run's training curves, read from its curves file (growing while it trains)."""

    return jsonify(run_curves(run_or_404(run_id)))


@bp.post("/runs")
@admin_api
def start_run():
    """Start `rl-train` as a child process (the web server never trains in-process)."""

    data = json_body({"algorithm", "max_steps"}, required=False)
    algorithm = data.get("algorithm")  # none given: the configured one, or what the model's size picks
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise BadRequest(f"'algorithm' must be one of {', '.join(ALGORITHMS)}.")
    max_steps = data.get("max_steps")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise BadRequest("'max_steps' must be a positive integer.")

    if training_in_progress():  # the run's lock, not its row: a dead run's row must not block new runs
        raise Conflict("A training run is already in progress.")
    events = feedback_event_count()
    needed = int(sized_setting("retrain_min_feedback"))
    if events < needed:
        raise Conflict(f"Not enough feedback yet: {events} feedback events, need at least {needed}.")
    run_id, proc = spawn_training(algorithm, max_steps, trigger="manual")
    return jsonify(started=True, run_id=run_id, pid=proc.pid, status="queued",
                   algorithm=algorithm or current_settings().training.algorithm), 202


# ---------------------------------------------------------------------------- feedback & export


@bp.get("/feedback")
@admin_api
def browse_feedback():
    return jsonify(feedback_page(request.args))


@bp.get("/export")
@admin_api
def export():

    fmt = request.args.get("format", "")
    if fmt not in EXPORT_FORMATS:
        raise BadRequest(f"format must be one of {', '.join(EXPORT_FORMATS)}.")
    # e-mail addresses and phone numbers are redacted unless the admin asks for ?redact=0
    redact = request.args.get("redact", "1").lower()
    if redact not in ("1", "0", "true", "false", "yes", "no"):
        raise BadRequest("redact must be 1 or 0.")
    rows = export_rows(fmt, redact=redact in ("1", "true", "yes"))
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return Response(body, mimetype="application/x-ndjson",
                    headers={"Content-Disposition": f'attachment; filename="feedback-{fmt}.jsonl"'})


# ---------------------------------------------------------------------------- raters (feedback integrity)

@bp.get("/raters")
@admin_api
def list_raters():
    """Raters with their feedback events, latest assessment and trust; filtered, sorted, paged."""
    return jsonify(rater_page(request.args))


@bp.post("/raters/<int:user_id>/trust")
@admin_api
def post_rater_trust(user_id: int):
    """``{"trust": "auto"|"trusted"|"quarantined", "note"?}``: the admin's setting (audit-logged)."""
    return jsonify(rater=change_trust(user_id))


# ---------------------------------------------------------------------------- accounts

@bp.post("/users/<int:user_id>/sign-out")
@admin_api
def post_user_sign_out(user_id: int):
    """Sign an account (an end user's or another admin's) out everywhere (audit-logged)."""
    return jsonify(sign_user_out_everywhere(user_id))


@bp.get("/audit")
@admin_api
def audit_log():
    events = db.session.scalars(db.select(AuditEvent).order_by(AuditEvent.id.desc()).limit(200)).all()
    return jsonify(events=[e.to_dict() for e in events])
