"""Continuous learning: APScheduler jobs that close the loop without a human in it.

* retrain            -- every RLHF_RETRAIN_INTERVAL_SECONDS: when at least
                        RLHF_RETRAIN_MIN_FEEDBACK new feedback events arrived since the last
                        successful run, start ``rl-train`` in a child process (the web server
                        keeps answering; the run's flock keeps it to one run at a time, across
                        processes);
* experiment_monitor -- every RLHF_MONITOR_INTERVAL_SECONDS: start an experiment for a new
                        candidate; conclude a running one by the promotion policy;
* housekeeping       -- every RLHF_HOUSEKEEPING_INTERVAL_SECONDS: mark runs of dead processes
                        failed, delete temporary model directories, prune old retired versions.

Jobs live in the database (APScheduler's SQLAlchemyJobStore, table ``apscheduler_jobs``), so
the schedule survives restarts. Run the scheduler either inside the web process
(RLHF_SCHEDULER=1, one worker) or as its own process (``flask --app webapp scheduler``), not both.
"""
from __future__ import annotations

import fcntl
import logging
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flask import Flask, current_app

from rlhf import registry
from rlhf.adapters import base_of, is_adapter

from .admin_auth import audit
from .bootstrap import active_version
from .experiments import running_experiment
from .extensions import db
from .models import Comparison, Experiment, Feedback, ModelVersion, TrainingRun, utcnow

log = logging.getLogger("webapp.scheduler")

JOB_IDS = ("retrain", "experiment_monitor", "housekeeping")
_APP: Flask | None = None  # the app the persisted jobs run against (set by start)
_CHILDREN: list[subprocess.Popen] = []


# ---------------------------------------------------------------------------- job bodies

def training_in_progress() -> bool:
    """True while some process holds the training lock (see webapp.training)."""
    path = Path(current_app.config["INSTANCE_DIR"]) / "training.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def new_feedback_events() -> int:
    """Feedback events (rated answers, corrections, votes) since the last successful run started."""
    last = db.session.scalars(db.select(TrainingRun).filter_by(status="succeeded")
                              .order_by(TrainingRun.id.desc())).first()
    since = last.started_at if last and last.started_at else datetime(1970, 1, 1)
    fb = db.session.scalar(db.select(db.func.count(Feedback.id)).where(Feedback.updated_at > since).where(
        db.or_(Feedback.thumb.is_not(None), Feedback.rating.is_not(None), Feedback.correction.is_not(None))))
    votes = db.session.scalar(db.select(db.func.count(Comparison.id)).where(Comparison.voted_at > since))
    return int(fb or 0) + int(votes or 0)


def retrain_tick() -> dict[str, Any]:
    global _CHILDREN
    _CHILDREN = [p for p in _CHILDREN if p.poll() is None]  # reap finished children
    if _CHILDREN or training_in_progress():  # a child may not hold the lock yet right after its start
        return {"action": "skip", "reason": "a training run is in progress"}
    events = new_feedback_events()
    needed = int(current_app.config["RLHF_RETRAIN_MIN_FEEDBACK"])
    if events < needed:
        return {"action": "skip", "reason": f"{events} new feedback events, waiting for {needed}"}
    from .api.admin import spawn_training

    proc = spawn_training(current_app.config["RLHF_RETRAIN_ALGORITHM"], trigger="schedule", min_feedback=0)
    _CHILDREN.append(proc)
    log.info("retrain: %s new feedback events, started rl-train (pid %s)", events, proc.pid)
    return {"action": "train", "pid": proc.pid, "new_events": events}


def _new_candidate() -> ModelVersion | None:
    """The newest candidate that was never in an experiment and can serve."""
    tried = {e.variant_version_id for e in db.session.scalars(db.select(Experiment))}
    for version in db.session.scalars(db.select(ModelVersion).filter_by(status="candidate")
                                      .order_by(ModelVersion.id.desc())):
        if version.id not in tried and registry.is_complete(version.path):
            return version
    return None


def monitor_tick() -> dict[str, Any]:
    from .ab_metrics import experiment_metrics
    from .experiment_service import conclude_experiment, create_experiment
    from .promotion import PolicySettings, decide

    cfg = current_app.config
    exp = running_experiment()
    if exp is None:
        candidate, active = _new_candidate(), active_version()
        if candidate is None or active is None:
            return {"action": "idle"}
        key = f"auto-{candidate.name}-{utcnow().strftime('%Y%m%d%H%M%S')}"
        create_experiment(key, active.id, candidate.id, float(cfg["RLHF_EXPERIMENT_SPLIT"]), actor="scheduler")
        log.info("monitor: started experiment %s (%s vs %s)", key, active.name, candidate.name)
        return {"action": "start", "experiment": key}
    settings = PolicySettings(cfg["RLHF_PRIMARY_METRIC"], float(cfg["RLHF_PROMOTE_ALPHA"]),
                              float(cfg["RLHF_EXPERIMENT_MAX_HOURS"]))
    hours = (utcnow() - (exp.started_at or exp.created_at)).total_seconds() / 3600
    decision = decide(experiment_metrics(exp), settings, hours)
    if decision.action == "wait":
        return {"action": "wait", "experiment": exp.key, **decision.to_dict()}
    conclude_experiment(exp.key, "promote" if decision.action == "promote" else "keep_control",
                        {"policy": decision.to_dict()}, actor="scheduler")
    log.info("monitor: %s %s: %s", decision.action, exp.key, decision.reason)
    return {"action": decision.action, "experiment": exp.key, **decision.to_dict()}


def housekeeping_tick() -> dict[str, Any]:
    from .training import recover_stale_runs, training_lock

    recovered: list[int] = []
    removed_tmp = 0
    if not training_in_progress():
        try:
            with training_lock():  # holding it proves no run is alive
                recovered = recover_stale_runs()
                removed_tmp = registry.remove_stale_temporaries(current_app.config["MODEL_STORE"])
                runs_dir = Path(current_app.config["INSTANCE_DIR"]) / "runs"
                for tmp in runs_dir.glob(".tmp-run-*") if runs_dir.is_dir() else []:
                    shutil.rmtree(tmp, ignore_errors=True)
        except Exception as exc:  # another process took the lock in between: try next time
            log.info("housekeeping: skipped recovery (%s)", exc)
    pruned = prune_retired_versions(int(current_app.config["RLHF_RETAIN_RETIRED_VERSIONS"]))
    if recovered or pruned:
        audit("housekeeping", "", recovered_runs=recovered, pruned_versions=pruned, actor="scheduler")
        db.session.commit()
    return {"action": "housekeeping", "recovered_runs": recovered, "pruned": pruned, "removed_tmp": removed_tmp}


def prune_retired_versions(keep: int) -> list[str]:
    """Delete the files of retired versions beyond the ``keep`` most recent. The active
    version's parent (the roll-back target), versions in a running experiment and the base of
    any LoRA adapter version that keeps its files are kept; database rows stay (answers
    reference them), marked pruned."""
    active = active_version()
    exp = running_experiment()
    protected = {active.parent_id} if active and active.parent_id else set()
    if exp:
        protected |= {exp.control_version_id, exp.variant_version_id}
    retired = [v for v in db.session.scalars(db.select(ModelVersion).filter_by(status="retired")
                                             .order_by(ModelVersion.id.desc()))
               if v.id not in protected and Path(v.path).exists()]
    doomed = {v.path for v in retired[keep:]}
    # a LoRA adapter version runs on its base version's weights: a base stays while any version
    # built on it keeps its files (rlhf.adapters)
    needed = set()
    for v in db.session.scalars(db.select(ModelVersion)):
        if v.path not in doomed and is_adapter(v.path):
            try:
                needed.add(str(base_of(v.path).resolve()))
            except (OSError, ValueError, KeyError):  # an unreadable adapter cannot protect anything
                pass
    pruned = []
    for version in retired[keep:]:
        if str(Path(version.path).resolve()) in needed:
            continue
        if Path(version.path).resolve().parent == Path(current_app.config["MODEL_STORE"]).resolve():
            shutil.rmtree(version.path, ignore_errors=True)
            version.metrics = {**(version.metrics or {}), "pruned_at": utcnow().isoformat()}
            pruned.append(version.name)
    db.session.commit()
    return pruned


TICKS = {"retrain": retrain_tick, "experiment_monitor": monitor_tick, "housekeeping": housekeeping_tick}


def run_job(name: str) -> None:
    """Entry point of every persisted job (referenced by name, so it survives restarts)."""
    if _APP is None:
        log.warning("scheduler job %s fired before the app was set", name)
        return
    with _APP.app_context():
        try:
            result = TICKS[name]()
            if result.get("action") not in ("skip", "idle", "wait"):
                log.info("%s: %s", name, result)
        except Exception:
            db.session.rollback()
            log.exception("scheduler job %s failed", name)
        finally:
            db.session.remove()


# ---------------------------------------------------------------------------- the scheduler

def build_scheduler(app: Flask, blocking: bool = False):
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.schedulers.blocking import BlockingScheduler

    global _APP
    _APP = app
    with app.app_context():
        engine = db.engine
    cls = BlockingScheduler if blocking else BackgroundScheduler
    scheduler = cls(jobstores={"default": SQLAlchemyJobStore(engine=engine)}, timezone=timezone.utc,
                    job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 600})
    cfg = app.config
    intervals = {"retrain": cfg["RLHF_RETRAIN_INTERVAL_SECONDS"], "experiment_monitor": cfg["RLHF_MONITOR_INTERVAL_SECONDS"],
                 "housekeeping": cfg["RLHF_HOUSEKEEPING_INTERVAL_SECONDS"]}
    for job_id in JOB_IDS:
        scheduler.add_job("webapp.scheduler:run_job", "interval", seconds=float(intervals[job_id]), args=[job_id],
                          id=job_id, name=job_id.replace("_", " "), replace_existing=True)
    return scheduler


def start_background(app: Flask):
    scheduler = build_scheduler(app)
    scheduler.start()
    app.extensions["rlhf_scheduler"] = scheduler
    log.info("scheduler started in the web process")
    return scheduler


def scheduled_jobs() -> list[dict[str, Any]]:
    """Next run of each job, read from the job store (works whichever process runs them)."""
    from sqlalchemy import inspect, text

    if "apscheduler_jobs" not in inspect(db.engine).get_table_names():
        return []
    rows = db.session.execute(text("SELECT id, next_run_time FROM apscheduler_jobs ORDER BY next_run_time")).all()
    return [{"name": job_id.replace("_", " "),
             "next_run": datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if ts else None}
            for job_id, ts in rows]
