"""Server-rendered admin dashboard pages. Actions on them call the admin JSON API."""
from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from flask import Blueprint, current_app, render_template, request
from jinja2 import Undefined
from markupsafe import Markup, escape
from werkzeug.exceptions import NotFound

from rlhf.algorithms import ALGORITHMS
from rlhf.data.criteria import FLAG_CATEGORIES
from rlhf.settings import CycleSettings
from webapp.admin.auth import admin_page, recent_failures
from webapp.admin.charts import curve_figures, line_chart
from webapp.admin.feedback_browser import feedback_page
from webapp.admin.raters import RATER_FILTERS, SORTS, STATUS_FILTERS, rater_page, trust_section
from webapp.admin.runs import run_dict, run_or_404
from webapp.core.display import display_path, display_text
from webapp.core.extensions import db
from webapp.core.models import AuditEvent, Experiment, Message, ModelVersion, TrainingRun, User, active_version, utcnow
from webapp.core.ratings.stars import STARS
from webapp.core.ratings.thumb import THUMBS
from webapp.core.settings import effective
from webapp.experiments.assignment import running_experiment
from webapp.experiments.lifecycle import get_experiment
from webapp.experiments.metrics import default_experiment, experiment_metrics
from webapp.experiments.promotion import Decision, decide, policy_from_config
from webapp.serving.routing import serving_problems
from webapp.training import scheduler
from webapp.training.curves import STAGE_TITLES, policy_title, run_curves
from webapp.training.records import feedback_events

log = logging.getLogger("webapp.admin")

bp = Blueprint("admin_pages", __name__, url_prefix="/admin")


@bp.app_template_filter("pct")
def pct(value, digits: int = 1):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–"  # None, or a figure an older run did not record
    return f"{value * 100:.{digits}f}%"


@bp.app_template_filter("num")
def num(value, digits: int = 3):
    if value is None or isinstance(value, Undefined):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def as_utc(value: Any) -> datetime | None:
    """A naive UTC datetime (whole seconds) from a datetime (naive = UTC) or an ISO string
    ("...Z", "+00:00", or a trailing " UTC"); None for anything else."""
    if isinstance(value, str):
        text = value.strip()
        text = text[:-4] if text.endswith(" UTC") else text
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value.replace(microsecond=0)


@bp.app_template_filter("ts")
def ts(value: Any, empty: str = "–") -> Markup:
    """A timestamp as ``<time>``: readable UTC text without JavaScript ("23 Nov 2026, 14:05 UTC"),
    the exact time (ISO, UTC) in ``datetime`` and on hover; static/js/admin.js rewrites the text
    in the browser's time zone (or "5 min ago")."""
    dt = as_utc(value)
    if dt is None:
        return Markup(escape(value)) if value not in (None, "") else Markup(escape(empty))
    exact = dt.isoformat() + "Z"
    text = f"{dt.day} {dt:%b %Y, %H:%M} UTC"
    return Markup(f'<time datetime="{exact}" title="{exact}" data-local>{text}</time>')


@bp.app_template_filter("path")
def path_filter(value: Any) -> str:
    return display_path(value) if isinstance(value, str) else value


def _count(q) -> int:
    return int(db.session.scalar(db.select(db.func.count()).select_from(q.subquery())) or 0)


def feedback_summary(since: datetime) -> dict[str, Any]:
    """All-time feedback events and those since ``since``, by the one definition training and
    the scheduler count (webapp.training.records.feedback_events: total and breakdown)."""

    return {"all": feedback_events(), "recent": feedback_events(since)}


def scheduler_summary() -> dict[str, Any]:
    """The scheduler card: {"running", "enabled", "where", "jobs", "last_retrain", "error"} from
    webapp.training.scheduler.scheduler_status(). Never raises: a failure shows on the card instead of
    breaking the overview."""

    out: dict[str, Any] = {"running": None, "enabled": None, "where": None, "jobs": [], "last_retrain": None,
                           "error": None}
    try:
        status = scheduler.scheduler_status() or {}
        out.update(running=status.get("running"), enabled=status.get("enabled"), where=status.get("where"),
                   last_retrain=status.get("last_retrain") or None)
        for job in status.get("jobs") or []:
            name = job.get("name") or str(job.get("id", "")).replace("_", " ") or "job"
            out["jobs"].append({"id": job.get("id"), "name": name, "next_run": job.get("next_run")})
    except Exception as exc:  # the card says so; the rest of the overview still renders
        log.exception("reading the scheduler status failed")
        db.session.rollback()
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


@bp.get("/")
@admin_page
def overview():
    now = utcnow()
    since = now - timedelta(days=1)
    stats = {
        # visitors: anonymous ones and those who registered an account (admins are not counted)
        "users": _count(db.select(User.id).where(db.or_(User.anon_id.is_not(None),
                                                        db.and_(User.password_hash.is_not(None),
                                                                User.is_admin.is_(False))))),
        "answers": _count(db.select(Message.id).where(Message.role == "assistant")),
        "answers_24h": _count(db.select(Message.id).where(Message.role == "assistant", Message.created_at >= since)),
    }
    exp = running_experiment()
    summary = experiment_metrics(exp) if exp else None
    runs = db.session.scalars(db.select(TrainingRun).order_by(TrainingRun.id.desc()).limit(5)).all()
    events = db.session.scalars(db.select(AuditEvent).order_by(AuditEvent.id.desc()).limit(10)).all()
    return render_template("admin/overview.html", stats=stats, feedback=feedback_summary(since),
                           active=active_version(), experiment=exp, summary=summary,
                           runs=[run_dict(r) for r in runs], events=events, scheduler=scheduler_summary(),
                           problems=serving_problems(), signin_failures=recent_failures())


def experiment_defaults(versions: list[ModelVersion], active: ModelVersion | None
                        ) -> tuple[ModelVersion | None, ModelVersion | None]:
    """Default arms of a new experiment among ``versions`` (newest first): the active version as
    control (else the newest), and as variant the newest candidate, else the newest other
    version. (control, None) when there is no second version."""
    if not versions:
        return None, None
    control = next((v for v in versions if active is not None and v.id == active.id), versions[0])
    others = [v for v in versions if v.id != control.id]
    variant = next((v for v in others if v.status == "candidate"), others[0] if others else None)
    return control, variant


@bp.get("/experiments")
@admin_page
def experiments():
    exps = db.session.scalars(db.select(Experiment).order_by(Experiment.id.desc())).all()
    versions = db.session.scalars(db.select(ModelVersion).where(ModelVersion.status != "failed",
                                                                ModelVersion.kind != "reward")
                                  .order_by(ModelVersion.id.desc())).all()
    control, variant = experiment_defaults(versions, active_version())
    return render_template("admin/experiments.html", experiments=exps, versions=versions, control=control,
                           variant=variant, running=running_experiment())


# name, title, percent, y range
CHARTS = (("answers", "Answers per {unit}", False, None), ("thumbs_up_rate", "Thumbs-up rate, cumulative", True, None),
          ("mean_rating", "Mean rating (1-5), cumulative", False, (1.0, 5.0)))


@bp.get("/experiments/<key>")
@admin_page
def experiment_detail(key: str):
    exp = get_experiment(key)
    data = experiment_metrics(exp)
    timeline = data["timeline"]
    unit = timeline["unit"] or "hour"
    charts = [{"name": name, "title": title.format(unit=unit),
               "svg": line_chart(timeline["starts"], timeline["series"][name], title=title.format(unit=unit),
                                 percent=percent, unit=timeline["unit"], y_range=y_range)}
              for name, title, percent, y_range in CHARTS]
    verdict = None
    if exp.status == "running":  # what the monitor would decide now, and why
        hours = (utcnow() - (exp.started_at or exp.created_at)).total_seconds() / 3600
        try:
            verdict = decide(data, policy_from_config(current_app.config), hours)
        except ValueError as exc:  # a primary metric the table does not have: say so instead of failing
            verdict = Decision("unknown", f"the promotion policy cannot decide: {exc}", {})
    return render_template("admin/experiment.html", exp=exp, data=data, charts=charts, unit=unit, verdict=verdict)


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
    return render_template("admin/runs.html", runs=[run_dict(r) for r in rows], algorithms=ALGORITHMS)


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}.{key}").items()}
    return {prefix: value}


def run_settings(config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The training settings a run recorded, flattened (``training.policy.lora_r``), each marked
    when it differs from the default."""
    defaults = _flat(CycleSettings().to_dict(), "training")
    recorded = _flat({k: v for k, v in (config or {}).items() if k != "limits"}, "training")
    return [{"name": name, "value": value, "changed": name in defaults and defaults[name] != value}
            for name, value in recorded.items() if name != "training.device"]


@bp.get("/runs/<int:run_id>")
@admin_page
def run_detail(run_id: int):
    run = run_or_404(run_id)

    data = run_curves(run)
    other = None
    compare = request.args.get("compare", "")
    if compare.isdigit() and int(compare) != run.id:
        other_run = db.session.get(TrainingRun, int(compare))
        other = run_curves(other_run) if other_run is not None else None
    choices = db.session.execute(db.select(TrainingRun.id, TrainingRun.algorithm, TrainingRun.status)
                                 .where(TrainingRun.id != run.id).order_by(TrainingRun.id.desc()).limit(100)).all()
    return render_template("admin/run.html", run=run_dict(run, full=True), figures=curve_figures(data, other),
                           compare_id=other["run_id"] if other else None, compare_choices=choices,
                           stage_titles={**STAGE_TITLES, "policy": policy_title(run.algorithm)},
                           has_curves=bool(data["series"]), settings_rows=run_settings(run.config),
                           trust=trust_section(run.feedback_counts))


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
    return render_template("admin/feedback.html", page=page, filters=filters, versions=versions,
                           flag_categories=FLAG_CATEGORIES, thumbs=THUMBS, stars=[str(n) for n in STARS])


@bp.get("/raters")
@admin_page
def raters():
    """Raters: feedback volume, the latest assessment, the admin's trust setting (quarantine,
    restore, trust: admin.js calls POST /api/admin/raters/<id>/trust)."""
    args = {k: v for k, v in request.args.items() if v and k in RATER_FILTERS}
    page = rater_page(args)
    filters = {k: v for k, v in args.items() if k != "page"}
    return render_template("admin/raters.html", page=page, filters=filters, statuses=STATUS_FILTERS, sorts=SORTS)


def _code_spans(text: str) -> Markup:
    """Escaped text with its `code` spans (as the docs write them) in <code>."""
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text))))


@bp.get("/settings")
@admin_page
def settings():
    """Every setting's effective value and source, read-only (secrets masked), grouped."""
    rows = effective(current_app.config["RLHF_SETTINGS"], current_app.config["RLHF_SETTING_SOURCES"])
    groups: dict[str, list[dict]] = {}
    for row in rows:
        row = {**row, "value": display_text(row["value"]), "doc": _code_spans(row["doc"]),
               "source": display_path(row["source"]) if row["source"].startswith("/") else row["source"]}
        groups.setdefault(row["group"], []).append(row)
    return render_template("admin/settings.html", groups=groups)

