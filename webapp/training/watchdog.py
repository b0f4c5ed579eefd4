"""Time limits of training runs and the watchdog that enforces them: a run without progress for
RLHF_RUN_STALL_SECONDS, or past its time limit, is failed and its process group stopped, by a
thread inside the run (``RunWatchdog``) and by the scheduler's ``watchdog`` job for a process
that stopped responding altogether (``enforce_run_limits``)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import current_app

from rlhf.models.size_settings import parameter_count  # reads safetensors headers (no torch)
from rlhf.policy.algorithms import algorithm  # light: each algorithm loads its trainer only to train

if TYPE_CHECKING:  # the ML stack is imported by the run itself, not by the web app
    from rlhf.cycle import CycleSettings
    from rlhf.data.stage_sizing import DataSize

from webapp.core.extensions import db
from webapp.core.models import TrainingRun, utcnow
from webapp.training.runs import EXIT_FAILED, _pid_is_training


def auto_max_seconds(settings: CycleSettings, size: DataSize, parent_path: str | Path) -> float:
    """A run's time limit when RLHF_RUN_MAX_SECONDS is 0: 30 minutes, plus 2 s per unit of
    training work (a PPO/RLOO episode, a DPO/KTO row per epoch, a reward or judge pair per epoch), scaled
    up for models above 10 M parameters. Generous on purpose: a cycle on the embedded model does
    about 700 units in ~1 minute on 2 idle cores; the limit only catches runs that will never end
    (a run that stops making progress is caught much sooner by the stall limit)."""
    policy_units = algorithm(settings.algorithm).work_units(settings.policy, size)
    # reward pairs: the run's reward model (training pairs) and the gate's judge (held-out pairs)
    pairs = size.train_pairs + size.eval_pairs
    units = policy_units + pairs * settings.reward.epochs + settings.evaluation.max_prompts
    return round(1800.0 + 2.0 * units * max(1.0, (parameter_count(parent_path) or 0) / 1e7))


def run_limits(settings: CycleSettings, size: DataSize, parent_path: str | Path) -> dict[str, float]:
    """The watchdog's limits for a run (stored with it): seconds without progress, seconds in all."""
    cfg = current_app.config
    fixed = float(cfg["RLHF_RUN_MAX_SECONDS"])
    return {"stall_seconds": float(cfg["RLHF_RUN_STALL_SECONDS"]),
            "max_seconds": fixed if fixed > 0 else auto_max_seconds(settings, size, parent_path)}


def _limits_of(run: TrainingRun) -> dict[str, float]:
    cfg = current_app.config
    stored = (run.config or {}).get("limits") or {}
    return {"stall_seconds": float(stored.get("stall_seconds") or cfg["RLHF_RUN_STALL_SECONDS"]),
            "max_seconds": float(stored.get("max_seconds") or cfg["RLHF_RUN_MAX_SECONDS"] or 0) or float("inf")}


def run_health(run: TrainingRun, now: datetime | None = None) -> dict[str, Any]:
    """How a queued/running run is doing against its limits, for the dashboard and the watchdog:
    ``late`` once it has been quiet for a quarter of its stall limit (or used 3/4 of its time),
    ``overdue`` (with the reason) once the watchdog should stop it."""
    now = now or utcnow()
    limits = _limits_of(run)
    last_sign = run.heartbeat_at or run.started_at or run.created_at or now
    quiet = max(0.0, (now - last_sign).total_seconds())
    elapsed = max(0.0, (now - (run.started_at or run.created_at or now)).total_seconds())
    stall, most = limits["stall_seconds"], limits["max_seconds"]
    reason = None
    if run.status in ("queued", "running"):
        if quiet > stall:
            what = ("never started" if run.status == "queued"
                    else f"no progress for {quiet:.0f} s during stage {run.stage}")
            reason = f"{what} (limit {stall:.0f} s without progress)"
        elif elapsed > most:
            reason = f"ran for {elapsed:.0f} s, past its limit of {most:.0f} s"
    late = run.status in ("queued", "running") and (quiet > stall / 4 or elapsed > 0.75 * most)
    message = None
    if late and not reason:
        message = (f"no progress for {quiet:.0f} s; stopped after {stall:.0f} s without progress" if quiet > stall / 4
                   else f"running for {elapsed:.0f} s; stopped at {most:.0f} s")
    return {"quiet_seconds": round(quiet, 1), "elapsed_seconds": round(elapsed, 1), "late": late,
            "overdue": reason, "message": message or reason, **limits}


def _kill_run_process(pid: int, grace: float = 10.0) -> bool:
    """SIGKILL the run's process (its whole process group when it leads one, as spawned runs do)
    and wait until it is gone. False if it was not (or no longer) a training process."""
    if not _pid_is_training(pid):
        return False
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while _pid_is_training(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def _fail_run(run_id: int, reason: str) -> bool:
    """Mark a queued/running run failed by the watchdog and remove its work directory."""
    run = db.session.get(TrainingRun, run_id)
    if run is None or run.status not in ("queued", "running"):
        return False
    run.status, run.finished_at = "failed", utcnow()
    run.error = f"stopped by the watchdog: {reason}"
    run.log = (run.log or "") + f"[{utcnow().strftime('%H:%M:%S')}] stopped by the watchdog: {reason}\n"
    db.session.commit()
    shutil.rmtree(Path(current_app.config["INSTANCE_DIR"]) / "runs" / f".tmp-run-{run_id}", ignore_errors=True)
    return True


def enforce_run_limits(now: datetime | None = None) -> list[dict[str, Any]]:
    """The watchdog (a scheduler job): stop every run of this host that has been quiet past its
    stall limit or has run past its time limit: kill its process group (which releases the
    training lock), mark it failed with the reason, remove its work directory. Runs of other
    hosts cannot be stopped from here; their rows are left to them (the dashboard shows them late)."""
    stopped = []
    host = socket.gethostname()
    for run in db.session.scalars(db.select(TrainingRun).where(TrainingRun.status.in_(("queued", "running")))).all():
        reason = run_health(run, now)["overdue"]
        if not reason or (run.hostname and run.hostname != host):
            continue
        killed = _kill_run_process(run.pid) if run.pid else False
        db.session.expire_all()
        if _fail_run(run.id, reason):
            stopped.append({"run_id": run.id, "pid": run.pid, "killed": killed, "reason": reason})
    return stopped


class RunWatchdog:
    """The run's own watchdog, a thread inside ``rl-train``: every progress report beats it; if
    none comes for the stall limit (a trainer looping without steps, a stuck read), or the run
    passes its time limit, it marks the run failed and ends the process (exit 1), which releases
    the training lock. The heartbeat comes from the training loop itself, never from a timer, so
    a hung loop cannot keep it alive."""

    def __init__(self, app: Any, run_id: int, limits: dict[str, float], exit_process: bool = True) -> None:
        self.app, self.run_id, self.limits, self.exit_process = app, run_id, limits, exit_process
        self.started = self.last = time.monotonic()
        self.stage = "start"
        self.fired: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"watchdog-run-{run_id}", daemon=True)

    def start(self) -> "RunWatchdog":
        self._thread.start()
        return self

    def beat(self, stage: str) -> None:
        self.last, self.stage = time.monotonic(), stage

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        stall, most = self.limits["stall_seconds"], self.limits["max_seconds"]
        while not self._stop.wait(max(0.05, min(5.0, stall / 10))):
            now = time.monotonic()
            if now - self.last > stall:
                reason = f"no progress for {now - self.last:.0f} s during stage {self.stage} (limit {stall:.0f} s)"
            elif now - self.started > most:
                reason = f"ran for {now - self.started:.0f} s, past its limit of {most:.0f} s"
            else:
                continue
            self.fired = reason
            with self.app.app_context():
                try:
                    _fail_run(self.run_id, reason)
                finally:
                    db.session.remove()
            if self.exit_process:
                print(f"Error: training run #{self.run_id} stopped by the watchdog: {reason}", file=sys.stderr,
                      flush=True)
                os._exit(EXIT_FAILED)
            return
