"""Admin JSON API: metrics, experiments, versions, training runs, feedback, export.
Everything here answers 401 without an admin login; state changes also need the CSRF token."""
from __future__ import annotations

import json
from pathlib import Path

from flask import Blueprint, Response, current_app, jsonify, request
from werkzeug.exceptions import BadRequest, Conflict, NotFound

from ..ab_metrics import default_experiment, display_paths, display_text, experiment_dict, experiment_metrics
from ..admin_auth import admin_api
from ..bootstrap import active_version
from ..experiment_service import (conclude_experiment, create_experiment, get_experiment, promote_version,
                                  rollback_version, set_split, stop_experiment)
from ..extensions import db
from ..models import AuditEvent, Conversation, Experiment, Feedback, Message, ModelVersion, TrainingRun, iso
from ..validation import bool_field, clip, json_body

bp = Blueprint("admin_api", __name__, url_prefix="/api/admin")


def run_or_404(run_id: int) -> TrainingRun:
    """The training run, or 404 "Training run not found." (API and pages alike)."""
    return db.get_or_404(TrainingRun, run_id, description="Training run not found.")


def run_dict(run: TrainingRun, full: bool = False) -> dict:
    """A run for the dashboard and the API; paths in it are relative to the instance folder."""
    data = {"id": run.id, "trigger": run.trigger, "algorithm": run.algorithm, "status": run.status,
            "stage": run.stage, "progress": run.progress, "error": display_text(run.error),
            "version_id": run.version_id,
            "decision": (run.metrics or {}).get("decision"), "created_at": iso(run.created_at),
            "started_at": iso(run.started_at), "finished_at": iso(run.finished_at),
            "heartbeat_at": iso(run.heartbeat_at), "pid": run.pid}
    if run.status in ("queued", "running"):
        from ..training import run_health

        health = run_health(run)
        data["late"] = health["message"] if health["late"] else None  # shown before the watchdog stops it
    if full:
        data.update(feedback_counts=run.feedback_counts, metrics=display_paths(run.metrics),
                    config=display_paths(run.config), log=display_text(run.log))
    return data


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


@bp.post("/experiments/<key>/stop")
@admin_api
def post_stop(key: str):
    return jsonify(experiment_dict(stop_experiment(key)))


@bp.post("/experiments/<key>/conclude")
@admin_api
def post_conclude(key: str):
    data = json_body({"decision"})
    exp = get_experiment(key)
    snapshot = {m["name"]: m["comparison"] for m in experiment_metrics(exp)["metrics"]}
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
    from ..curves import run_curves

    return jsonify(run_curves(run_or_404(run_id)))


@bp.post("/runs")
@admin_api
def start_run():
    """Start `rl-train` as a child process (the web server never trains in-process)."""
    from ..training import feedback_event_count, spawn_training

    data = json_body({"algorithm", "max_steps"}, required=False)
    algorithm = data.get("algorithm", "ppo")
    if algorithm not in ("ppo", "dpo", "kto", "rloo"):
        raise BadRequest("'algorithm' must be one of ppo, dpo, kto, rloo.")
    max_steps = data.get("max_steps")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise BadRequest("'max_steps' must be a positive integer.")
    from ..scheduler import training_in_progress

    if training_in_progress():  # the run's lock, not its row: a dead run's row must not block new runs
        raise Conflict("A training run is already in progress.")
    events = feedback_event_count()
    needed = int(current_app.config["RLHF_RETRAIN_MIN_FEEDBACK"])
    if events < needed:
        raise Conflict(f"Not enough feedback yet: {events} feedback events, need at least {needed}.")
    run_id, proc = spawn_training(algorithm, max_steps, trigger="manual")
    return jsonify(started=True, run_id=run_id, pid=proc.pid, algorithm=algorithm, status="queued"), 202


# ---------------------------------------------------------------------------- feedback & export

FEEDBACK_FILTERS = {"thumb", "rating", "version", "arm", "has_correction", "q", "page"}


@bp.get("/feedback")
@admin_api
def browse_feedback():
    return jsonify(feedback_page(request.args))


def feedback_page(args) -> dict:
    """Feedback rows with their answer and question, filtered; 50 per page, newest first."""
    unknown = set(args) - FEEDBACK_FILTERS
    if unknown:
        raise BadRequest(f"Unknown filter(s): {', '.join(clip(k) for k in sorted(unknown)[:10])}.")
    q = (db.select(Feedback, Message).join(Message, Feedback.message_id == Message.id)
         .join(Conversation, Message.conversation_id == Conversation.id).where(Conversation.deleted_at.is_(None)))
    if args.get("thumb"):
        if args["thumb"] not in ("up", "down"):
            raise BadRequest("thumb must be up or down.")
        q = q.where(Feedback.thumb == args["thumb"])
    if args.get("rating"):
        if args["rating"] not in {"1", "2", "3", "4", "5"}:
            raise BadRequest("rating must be 1-5.")
        q = q.where(Feedback.rating == int(args["rating"]))
    if args.get("arm"):
        if args["arm"] not in ("control", "variant"):
            raise BadRequest("arm must be control or variant.")
        q = q.where(Message.arm == args["arm"])
    if args.get("version"):
        q = q.join(ModelVersion, Message.model_version_id == ModelVersion.id).where(ModelVersion.name == args["version"])
    if args.get("has_correction") in ("1", "true", "yes"):
        q = q.where(Feedback.correction.is_not(None))
    if args.get("q"):
        like = f"%{args['q'][:200]}%"
        q = q.where(db.or_(Message.content.ilike(like), Feedback.comment.ilike(like), Feedback.correction.ilike(like)))
    page = args.get("page", "1")
    # ASCII digits only ("²".isdigit() is true), and few enough that the offset fits the database
    if not (page.isascii() and page.isdigit() and len(page) <= 9) or int(page) < 1:
        raise BadRequest("page must be a positive integer (at most 999999999).")
    page_n = int(page)
    total = db.session.scalar(db.select(db.func.count()).select_from(q.subquery()))
    rows = db.session.execute(q.order_by(Feedback.updated_at.desc()).limit(50).offset((page_n - 1) * 50)).all()
    versions = {v.id: v.name for v in db.session.scalars(db.select(ModelVersion))}
    items = []
    for fb, msg in rows:
        question = db.session.get(Message, msg.parent_id) if msg.parent_id else None
        items.append({"id": fb.id, "message_id": msg.id, "question": question.content if question else None,
                      "answer": msg.content, "thumb": fb.thumb, "rating": fb.rating, "correction": fb.correction,
                      "comment": fb.comment, "reasons": fb.reasons or [], "arm": msg.arm,
                      "model_version": versions.get(msg.model_version_id), "updated_at": iso(fb.updated_at)})
    return {"items": items, "total": total, "page": page_n, "pages": max(1, -(-total // 50))}


@bp.get("/export")
@admin_api
def export():
    from ..training import EXPORT_FORMATS, export_rows

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


@bp.get("/audit")
@admin_api
def audit_log():
    events = db.session.scalars(db.select(AuditEvent).order_by(AuditEvent.id.desc()).limit(200)).all()
    return jsonify(events=[e.to_dict() for e in events])
