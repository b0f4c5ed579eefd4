"""What each scheduled job does when it fires (webapp.training.scheduler decides when).

* retrain: start ``rl-train`` in a child process when enough new feedback arrived; it skips while a
  training run holds the training lock (and, unless RLHF_RETRAIN_DURING_EXPERIMENT, while an
  experiment runs), waits out housekeeping's brief hold, and says which it was;
* experiment_monitor: start an experiment for a new candidate; conclude a running one by the
  promotion policy;
* housekeeping: mark runs of dead processes failed, delete temporary model directories, prune old
  retired versions;
* watchdog: stop runs that stopped making progress or ran past their time limit;
* backup, openwebui_pull: a scheduled backup; Open WebUI's ratings imported.

Each returns what it did as a dict (``action``, ``reason``, ...): the scheduler records it for
the overview.
"""
from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

from flask import current_app

from rlhf.models import registry
from rlhf.models.adapters import base_of, is_adapter
from webapp.core import locks
from webapp.core.audit import audit
from webapp.core.extensions import db
from webapp.core.models import Experiment, ModelVersion, TrainingRun, active_version, utcnow
from webapp.experiments.assignment import running_experiment
from webapp.experiments.lifecycle import conclude_experiment, create_experiment
from webapp.experiments.metrics import experiment_metrics
from webapp.experiments.promotion import decide, policy_from_config
from webapp.training import runs as training_runs
from webapp.training.model_size import sized_setting
from webapp.training.records import feedback_events
from webapp.training.runs import (
    TRAINING_RUN,
    describe_holder,
    recover_stale_runs,
    spawn_training,
    training_lock,
    training_lock_holder,
)
from webapp.training.watchdog import enforce_run_limits

log = logging.getLogger("webapp.training.scheduler")

_CHILDREN: list[subprocess.Popen] = []  # rl-train children this process started


def training_in_progress() -> bool:
    """True while a training run (of any process) holds the training lock, or a holder that did
    not say what it is doing (webapp.training.runs); housekeeping's brief hold is no run."""
    who = training_lock_holder()
    return who is not None and not who.get("brief")


def _held_by(who: dict[str, Any]) -> dict[str, Any]:
    """What the overview keeps of a lock holder's record."""
    return {key: who.get(key) for key in ("job", "doing", "run_id", "pid", "since")}


def _child_in_progress(proc: subprocess.Popen) -> dict[str, Any]:
    """A retrain check's skip for a run this process started whose child is still alive."""
    busy = db.select(TrainingRun).where(TrainingRun.status.in_(("queued", "running"))).order_by(TrainingRun.id.desc())
    # its row names the child until the run takes it over (under accelerate launch, from another pid)
    row = db.session.scalars(busy.filter_by(pid=proc.pid)).first() or db.session.scalars(busy).first()
    which = f"#{row.id}" if row else f"pid {proc.pid}"
    return {"action": "skip", "reason": f"a training run ({which}) is in progress",
            "held_by": {"job": TRAINING_RUN, "doing": "training", "run_id": row.id if row else None,
                        "pid": proc.pid, "since": None}}


def _log_wait(who: dict[str, Any]) -> None:
    log.info("retrain: waiting for %s (%s, pid %s) to release the training lock", who.get("job") or "its holder",
             who.get("doing") or "no record", who.get("pid", "?"))


def new_feedback_events() -> int:
    """Feedback events (webapp.training.records.feedback_events) since the last successful run started."""

    last = db.session.scalars(db.select(TrainingRun).filter_by(status="succeeded")
                              .order_by(TrainingRun.id.desc())).first()
    return feedback_events(last.started_at if last and last.started_at else None)["total"]


def retrain_tick() -> dict[str, Any]:
    global _CHILDREN

    _CHILDREN = [p for p in _CHILDREN if p.poll() is None]
    if _CHILDREN:  # a child may not hold the lock yet right after its start
        return _child_in_progress(_CHILDREN[-1])
    # a training run's hold ends the check; housekeeping's brief one is waited out (a few seconds)
    patience = float(training_runs.BRIEF_HOLD_PATIENCE_SECONDS)
    who = locks.wait_out_brief(locks.lock_path("training"), patience, on_wait=_log_wait)
    if who is not None:
        return {"action": "skip", "reason": describe_holder(who, patience), "held_by": _held_by(who)}
    events = new_feedback_events()
    needed = int(sized_setting("retrain_min_feedback"))
    if events < needed:
        return {"action": "skip", "reason": f"{events} of {needed} new feedback events since the last run",
                "new_events": events, "needed": needed}
    exp = running_experiment()
    if exp is not None and not current_app.config["RLHF_RETRAIN_DURING_EXPERIMENT"]:
        # the next candidate grows from the experiment's winner, and training would slow the answers it measures
        return {"action": "skip", "reason": f"experiment {exp.key} is running: the next run waits for its verdict "
                f"({events} new feedback events)", "new_events": events, "needed": needed, "experiment": exp.key}
    run_id, proc = spawn_training(trigger="schedule", min_feedback=0)
    _CHILDREN.append(proc)
    log.info("retrain: %s new feedback events, started rl-train run #%s (pid %s)", events, run_id, proc.pid)
    return {"action": "train", "run_id": run_id, "pid": proc.pid, "new_events": events,
            "reason": f"{events} new feedback events (needs {needed}): started run #{run_id}"}


def watchdog_tick() -> dict[str, Any]:

    stopped = enforce_run_limits()
    for item in stopped:
        audit("run_stopped_by_watchdog", str(item["run_id"]), reason=item["reason"], actor="scheduler")
    if stopped:
        db.session.commit()
    return {"action": "stopped" if stopped else "idle", "stopped": stopped}


def _new_candidate() -> ModelVersion | None:
    """The newest candidate that was never in an experiment and can serve."""
    tried = {e.variant_version_id for e in db.session.scalars(db.select(Experiment))}
    for version in db.session.scalars(db.select(ModelVersion).filter_by(status="candidate")
                                      .order_by(ModelVersion.id.desc())):
        if version.id not in tried and registry.is_complete(version.location):
            return version
    return None


def monitor_tick() -> dict[str, Any]:

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
    settings = policy_from_config(cfg)
    hours = (utcnow() - (exp.started_at or exp.created_at)).total_seconds() / 3600
    # the sequential intervals the policy decides on stay valid however often this looks
    decision = decide(experiment_metrics(exp, settings), settings, hours)
    if decision.action == "wait":
        return {"action": "wait", "experiment": exp.key, **decision.to_dict()}
    conclude_experiment(exp.key, "promote" if decision.action == "promote" else "keep_control",
                        {"policy": decision.to_dict()}, actor="scheduler")
    log.info("monitor: %s %s: %s", decision.action, exp.key, decision.reason)
    return {"action": decision.action, "experiment": exp.key, **decision.to_dict()}


def housekeeping_tick() -> dict[str, Any]:

    recovered: list[int] = []
    removed_tmp = 0
    if not training_in_progress():
        try:
            # holding it proves no run is alive; its record tells others it is only for a moment
            with training_lock(job="housekeeping", doing="cleaning up stale runs", brief=True):
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
               if v.id not in protected and Path(v.location).exists()]
    doomed = {v.location for v in retired[keep:]}
    # a LoRA adapter version runs on its base version's weights: a base stays while any version
    # built on it keeps its files (rlhf.models.adapters)
    needed = set()
    for location in (v.location for v in db.session.scalars(db.select(ModelVersion))):
        if location not in doomed and is_adapter(location):
            try:
                needed.add(str(base_of(location).resolve()))
            except (OSError, ValueError, KeyError):  # an unreadable adapter cannot protect anything
                pass
    pruned, adapters = [], []
    for version in retired[keep:]:
        location = version.location
        if str(Path(location).resolve()) in needed:
            continue
        if Path(location).resolve().parent == Path(current_app.config["MODEL_STORE"]).resolve():
            if is_adapter(location):
                adapters.append(version.name)
            shutil.rmtree(location, ignore_errors=True)
            version.metrics = {**(version.metrics or {}), "pruned_at": utcnow().isoformat()}
            pruned.append(version.name)
    db.session.commit()
    _unload_adapters(adapters)
    return pruned


def _unload_adapters(names: list[str]) -> None:
    """Pruned LoRA versions leave the inference server too (RLHF_INFERENCE_URL), best effort: a
    server that is down has forgotten them anyway."""
    url = current_app.config.get("RLHF_INFERENCE_URL")
    if not url or not names:
        return
    from rlhf.generation.remote import InferenceClient, InferenceServerError

    client = InferenceClient(url, 10.0, current_app.config.get("RLHF_INFERENCE_API_KEY"))
    for name in names:
        try:
            client.unload_adapter(name)
        except InferenceServerError as exc:
            log.warning("housekeeping: could not unload %s from the inference server: %s", name, exc)


def backup_tick() -> dict[str, Any]:
    """A scheduled backup (RLHF_BACKUP_INTERVAL_HOURS; the job stays in the job store when the
    setting is turned off, and then does nothing)."""
    if float(current_app.config["RLHF_BACKUP_INTERVAL_HOURS"]) <= 0:
        return {"action": "skip", "reason": "scheduled backups are off (RLHF_BACKUP_INTERVAL_HOURS=0)"}
    from webapp.core.backup import scheduled_backup

    return scheduled_backup()


def openwebui_pull_tick() -> dict[str, Any]:
    """Open WebUI's ratings pulled and imported (RLHF_OPENWEBUI_URL; like the backup job, it stays
    in the job store when the setting is removed, and then does nothing)."""
    from webapp.training.openwebui_pull import pull_tick

    return pull_tick()


TICKS = {"retrain": retrain_tick, "experiment_monitor": monitor_tick, "housekeeping": housekeeping_tick,
         "watchdog": watchdog_tick, "backup": backup_tick, "openwebui_pull": openwebui_pull_tick}
