"""Server-rendered admin dashboard pages. Actions on them call the admin JSON API."""
from __future__ import annotations

from datetime import timedelta

from flask import Blueprint, render_template, request
from werkzeug.exceptions import NotFound

from .ab_metrics import default_experiment, experiment_metrics
from .admin_auth import admin_page
from .api.admin import feedback_page, run_dict
from .bootstrap import active_version
from .experiment_service import get_experiment
from .experiments import running_experiment
from .extensions import db
from .models import (AuditEvent, Comparison, Conversation, Experiment, Feedback, Message, ModelVersion, TrainingRun,
                     User, utcnow)
from .scheduler import scheduled_jobs
from .serving import serving_problems
from .svg_charts import line_chart

bp = Blueprint("admin_pages", __name__, url_prefix="/admin")


@bp.app_template_filter("pct")
def pct(value, digits: int = 1):
    return "–" if value is None else f"{value * 100:.{digits}f}%"


@bp.app_template_filter("num")
def num(value, digits: int = 3):
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


@bp.get("/")
@admin_page
def overview():
    since = utcnow() - timedelta(days=1)
    count = lambda q: db.session.scalar(db.select(db.func.count()).select_from(q.subquery()))  # noqa: E731
    stats = {
        "users": count(db.select(User.id).where(User.anon_id.is_not(None))),
        "conversations": count(db.select(Conversation.id).where(Conversation.deleted_at.is_(None))),
        "answers": count(db.select(Message.id).where(Message.role == "assistant")),
        "answers_24h": count(db.select(Message.id).where(Message.role == "assistant", Message.created_at >= since)),
        "feedback": count(db.select(Feedback.id)),
        "feedback_24h": count(db.select(Feedback.id).where(Feedback.updated_at >= since)),
        "votes": count(db.select(Comparison.id).where(Comparison.winner.is_not(None))),
    }
    exp = running_experiment()
    summary = experiment_metrics(exp) if exp else None
    runs = db.session.scalars(db.select(TrainingRun).order_by(TrainingRun.id.desc()).limit(5)).all()
    events = db.session.scalars(db.select(AuditEvent).order_by(AuditEvent.id.desc()).limit(10)).all()
    return render_template("admin/overview.html", stats=stats, active=active_version(), experiment=exp,
                           summary=summary, runs=[run_dict(r) for r in runs], events=events,
                           scheduler=scheduled_jobs(), problems=serving_problems())


@bp.get("/experiments")
@admin_page
def experiments():
    exps = db.session.scalars(db.select(Experiment).order_by(Experiment.id.desc())).all()
    versions = db.session.scalars(db.select(ModelVersion).where(ModelVersion.status != "failed")
                                  .order_by(ModelVersion.id.desc())).all()
    return render_template("admin/experiments.html", experiments=exps, versions=versions, active=active_version(),
                           running=running_experiment())


@bp.get("/experiments/<key>")
@admin_page
def experiment_detail(key: str):
    exp = get_experiment(key)
    data = experiment_metrics(exp)
    charts = {name: line_chart(data["daily"]["dates"], data["daily"]["series"][name], title=title,
                               percent=name == "thumbs_up_rate")
              for name, title in (("answers", "Answers per day"), ("thumbs_up_rate", "Thumbs-up rate per day"),
                                  ("mean_rating", "Mean rating per day"))}
    return render_template("admin/experiment.html", exp=exp, data=data, charts=charts)


@bp.get("/experiment")
@admin_page
def current_experiment():
    exp = default_experiment()
    if exp is None:
        raise NotFound("There are no experiments yet.")
    return experiment_detail(exp.key)


@bp.get("/runs")
@admin_page
def runs():
    rows = db.session.scalars(db.select(TrainingRun).order_by(TrainingRun.id.desc()).limit(100)).all()
    return render_template("admin/runs.html", runs=[run_dict(r) for r in rows])


@bp.get("/runs/<int:run_id>")
@admin_page
def run_detail(run_id: int):
    run = db.session.get(TrainingRun, run_id)
    if run is None:
        raise NotFound("Training run not found.")
    return render_template("admin/run.html", run=run_dict(run, full=True))


@bp.get("/versions")
@admin_page
def versions():
    rows = db.session.scalars(db.select(ModelVersion).order_by(ModelVersion.id.desc())).all()
    return render_template("admin/versions.html", versions=rows, running=running_experiment())


@bp.get("/feedback")
@admin_page
def feedback():
    args = {k: v for k, v in request.args.items() if v}
    page = feedback_page(args)
    versions = db.session.scalars(db.select(ModelVersion.name).order_by(ModelVersion.id)).all()
    filters = {k: v for k, v in args.items() if k != "page"}
    return render_template("admin/feedback.html", page=page, filters=filters, versions=versions)
