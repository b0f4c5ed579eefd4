"""Continuous learning: APScheduler jobs that close the loop without a human in it.

* retrain            -- every RLHF_RETRAIN_INTERVAL_SECONDS: when at least
                        RLHF_RETRAIN_MIN_FEEDBACK new feedback events arrived since the last
                        successful run, start ``rl-train`` in a child process (the web server
                        keeps answering; the run's flock keeps it to one run at a time, across
                        processes). It skips while a training run holds that lock, and while an
                        experiment runs (RLHF_RETRAIN_DURING_EXPERIMENT=0: the next candidate grows
                        from the winner), but waits a few seconds for housekeeping's brief hold of
                        the lock, and says which it was;
* experiment_monitor -- every RLHF_MONITOR_INTERVAL_SECONDS: start an experiment for a new
                        candidate; conclude a running one by the promotion policy;
* housekeeping       -- every RLHF_HOUSEKEEPING_INTERVAL_SECONDS: mark runs of dead processes
                        failed, delete temporary model directories, prune old retired versions;
* watchdog           -- every RLHF_WATCHDOG_INTERVAL_SECONDS: stop runs that stopped making
                        progress or ran past their time limit (webapp.training.watchdog.enforce_run_limits);
* openwebui_pull     -- with RLHF_OPENWEBUI_URL, every RLHF_OPENWEBUI_PULL_INTERVAL_SECONDS: import the
                        ratings of Open WebUI's feedback export (webapp.training.openwebui_pull).

Jobs live in the database (APScheduler's SQLAlchemyJobStore, table ``apscheduler_jobs``), so
the schedule survives restarts. ``serve`` runs the scheduler in its process by default
(RLHF_SCHEDULER=1, one worker); with several workers it runs as its own process (``flask --app
webapp scheduler``). Only one scheduler runs per instance: it holds an exclusive ``flock`` on
``<instance>/scheduler.lock`` while it lives, and writes what it did last to
``<instance>/scheduler.json`` (the overview reads both).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from flask import Flask, current_app

from webapp.core import locks
from webapp.core.extensions import db
from webapp.core.models import utcnow
from webapp.training.jobs import TICKS

log = logging.getLogger("webapp.training.scheduler")

JOB_IDS = ("retrain", "experiment_monitor", "housekeeping", "watchdog")
# Seconds from a (re)start to each job's first run (or its interval, when shorter), staggered so
# that the jobs do not fire together: housekeeping's moment with the training lock is over well
# before the first retrain check, and their equal default intervals keep them this far apart.
FIRST_RUN_SECONDS = {"watchdog": 10.0, "housekeeping": 20.0, "retrain": 35.0, "experiment_monitor": 50.0,
                     "openwebui_pull": 65.0}
_APP: Flask | None = None  # the app the persisted jobs run against (set by start)
_LOCK_FILE = None  # the open scheduler.lock while this process runs the scheduler
_STATE_LOCK = threading.Lock()


class SchedulerAlreadyRunning(RuntimeError):
    """Another process of this instance runs the scheduler; the message says which."""


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
        except Exception as exc:
            db.session.rollback()
            log.exception("scheduler job %s failed", name)
            result = {"action": "error", "reason": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            db.session.remove()
        _record(name, result)


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
    intervals = {"retrain": cfg["RLHF_RETRAIN_INTERVAL_SECONDS"],
                 "experiment_monitor": cfg["RLHF_MONITOR_INTERVAL_SECONDS"],
                 "housekeeping": cfg["RLHF_HOUSEKEEPING_INTERVAL_SECONDS"],
                 "watchdog": cfg["RLHF_WATCHDOG_INTERVAL_SECONDS"]}
    # every job looks once soon after a (re)start, then at its interval: the overview can say at
    # once why the loop is or is not training, rather than "none yet" for an hour
    now = datetime.now(timezone.utc)

    def first_run(job_id: str, seconds: float) -> datetime:
        return now + timedelta(seconds=min(FIRST_RUN_SECONDS[job_id], seconds))

    for job_id in JOB_IDS:
        seconds = float(intervals[job_id])
        scheduler.add_job("webapp.training.scheduler:run_job", "interval", seconds=seconds, args=[job_id],
                          id=job_id, name=job_id.replace("_", " "), replace_existing=True,
                          next_run_time=first_run(job_id, seconds))
    backup_hours = float(cfg["RLHF_BACKUP_INTERVAL_HOURS"])
    if backup_hours > 0:  # optional: the first backup one interval after start
        scheduler.add_job("webapp.training.scheduler:run_job", "interval", seconds=backup_hours * 3600,
                          args=["backup"], id="backup", name="backup", replace_existing=True)
    if cfg.get("RLHF_OPENWEBUI_URL"):  # optional: the first pull soon after start, like the other jobs
        seconds = float(cfg["RLHF_OPENWEBUI_PULL_INTERVAL_SECONDS"])
        scheduler.add_job("webapp.training.scheduler:run_job", "interval", seconds=seconds, args=["openwebui_pull"],
                          id="openwebui_pull", name="openwebui pull", replace_existing=True,
                          next_run_time=first_run("openwebui_pull", seconds))
    return scheduler


def start_background(app: Flask):
    """Start the scheduler in this (web) process. Raises SchedulerAlreadyRunning when another
    process of the instance runs it."""
    claim_scheduler(app, "web process")
    scheduler = build_scheduler(app)
    scheduler.start()
    app.extensions["rlhf_scheduler"] = scheduler
    log.info("scheduler started in the web process")
    return scheduler


# ---------------------------------------------------------------------------- one per instance, and its state

def _instance(app: Flask | None = None) -> Path:
    return Path((app or current_app).config["INSTANCE_DIR"])


def _read_state(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / "scheduler.json").read_text())
    except (OSError, ValueError):
        return {}


def _write_state(folder: Path, state: dict[str, Any]) -> None:
    tmp = folder / f".scheduler.json.{os.getpid()}"
    tmp.write_text(json.dumps(state, default=str))
    os.replace(tmp, folder / "scheduler.json")


def claim_scheduler(app: Flask, where: str) -> None:
    """Take the instance's scheduler lock for this process's life, or raise
    SchedulerAlreadyRunning naming the process that has it."""
    global _LOCK_FILE
    if _LOCK_FILE is not None:
        return
    folder = _instance(app)
    try:
        f = locks.acquire(folder / "scheduler.lock", wait=False, job="scheduler", doing=where)
    except locks.LockBusy:
        other = _read_state(folder)
        raise SchedulerAlreadyRunning(
            f"the scheduler already runs for this instance ({other.get('where', 'another process')}, "
            f"pid {other.get('pid', '?')} on {other.get('hostname', '?')}); run it once per instance") from None
    _LOCK_FILE = f
    _write_state(folder, {"pid": os.getpid(), "hostname": socket.gethostname(), "where": where,
                          "started_at": utcnow().isoformat(), "last": {}})


def release_scheduler() -> None:
    global _LOCK_FILE
    if _LOCK_FILE is not None:
        _LOCK_FILE.close()  # closing the file drops the flock
        _LOCK_FILE = None


def _record(job: str, result: dict[str, Any]) -> None:
    """Remember each job's last outcome (the overview says why the last retrain did or did not
    start, and, when the training lock stopped it, who held the lock)."""
    if _APP is None:
        return
    folder = _instance(_APP)
    with _STATE_LOCK:
        state = _read_state(folder)
        state.setdefault("last", {})[job] = {"at": utcnow().isoformat(), "action": result.get("action"),
                                             "reason": result.get("reason"), "held_by": result.get("held_by")}
        _write_state(folder, state)


def scheduler_running() -> bool:
    """True while some process holds this instance's scheduler lock."""
    return _LOCK_FILE is not None or locks.is_held(_instance() / "scheduler.lock")


def scheduler_status() -> dict[str, Any]:
    """For the overview: whether the scheduler runs and where, each job's next run, and the
    last retrain decision (``{"at", "action", "reason", "held_by"}``; ``held_by``: the training
    lock's holder when that stopped it)."""
    running = scheduler_running()
    state = _read_state(_instance())
    last = (state.get("last") or {}).get("retrain")
    if last and last.get("at"):
        last = {**last, "at": datetime.fromisoformat(last["at"])}
    where = f"{state.get('where', 'another process')} (pid {state.get('pid', '?')})" if running else None
    return {"running": running, "enabled": bool(current_app.config["RLHF_SCHEDULER"]), "where": where,
            "jobs": [{"id": j["id"], "name": j["name"], "next_run": j["next_run_at"]} for j in scheduled_jobs()]
            if running else [],
            "last_retrain": last}


def scheduled_jobs() -> list[dict[str, Any]]:
    """Next run of each job, read from the job store (works whichever process runs them)."""
    from sqlalchemy import inspect, text

    if "apscheduler_jobs" not in inspect(db.engine).get_table_names():
        return []
    rows = db.session.execute(text("SELECT id, next_run_time FROM apscheduler_jobs ORDER BY next_run_time")).all()
    out = []
    for job_id, ts in rows:
        at = datetime.fromtimestamp(ts, timezone.utc).replace(tzinfo=None) if ts else None  # naive UTC, like the models
        out.append({"id": job_id, "name": job_id.replace("_", " "), "next_run_at": at,
                    "next_run": at.strftime("%Y-%m-%d %H:%M:%S UTC") if at else None})
    return out
