"""Training runs as records: the one-run-at-a-time lock, runs of dead processes, version names,
each run's folder, and runs started as child processes.

Only one run at a time per instance: the run holds an exclusive ``flock`` on
``<instance>/training.lock`` for its whole life (webapp.core.locks). The kernel drops the lock
when the process dies, so a run left "running" by a killed process is recognised (and marked
failed) by the next run that gets the lock -- no lock file ever has to be cleaned up by hand.
Housekeeping takes the same lock for a moment to clean up after dead runs; its lock record says
so (``brief``), and a run or a retrain check that finds it there waits a few seconds for it
rather than giving up, and never mistakes it for a training run.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from flask import current_app

from rlhf.training import distributed
from webapp.core import locks
from webapp.core.extensions import db
from webapp.core.models import ModelVersion, TrainingRun, utcnow
from webapp.core.settings import ROOT

# Exit codes of `rl-train` (documented in docs/cli.md).
EXIT_OK, EXIT_REFUSED, EXIT_GATE_REJECTED, EXIT_FAILED = 0, 2, 3, 1


class RunRefused(Exception):
    """The run cannot start; the message is the one-line reason."""


# ---------------------------------------------------------------------------- the lock

# How long a run (or housekeeping) waits for a job that holds the training lock only for a
# moment (housekeeping's cleanup) before it gives up; a training run is never waited for.
BRIEF_HOLD_PATIENCE_SECONDS = 10.0
TRAINING_RUN = "training run"  # the job a run's lock record names


@contextmanager
def training_lock(job: str = TRAINING_RUN, doing: str = "training", brief: bool = False,
                  patience: float | None = None, **detail: Any) -> Iterator[None]:
    """The instance's training lock for a ``with`` block, its record naming the holder (a
    training run by default, ``run_id`` when known; housekeeping says it is ``brief``), or
    RunRefused saying who holds it."""
    patience = BRIEF_HOLD_PATIENCE_SECONDS if patience is None else patience
    try:
        lock = locks.acquire(locks.lock_path("training"), wait=False, patience=patience, job=job, doing=doing,
                             brief=brief, **detail)
    except locks.LockBusy as busy:
        raise RunRefused(describe_holder(busy.holder, patience, other=True)) from None
    with lock:
        yield


def training_lock_holder() -> dict[str, Any] | None:
    """Who holds the training lock: None while nobody does, else its record (``{}``: none)."""
    return locks.holder(locks.lock_path("training"))


def describe_holder(who: dict[str, Any], patience: float, other: bool = False) -> str:
    """Why the training lock is taken, in words, from its holder's record (webapp.core.locks):
    "a training run (#12) is in progress", "housekeeping was cleaning up stale runs ...";
    never a training run when the holder is not one. ``other``: seen from a run that wanted it."""
    if who.get("job") == TRAINING_RUN:
        run_id = who.get("run_id")
        if run_id is None and who.get("pid") and who.get("hostname") == socket.gethostname():
            row = db.session.scalars(db.select(TrainingRun).filter_by(pid=who["pid"])
                                     .where(TrainingRun.status.in_(("queued", "running")))
                                     .order_by(TrainingRun.id.desc())).first()
            run_id = row.id if row else None
        which = f"#{run_id}" if run_id is not None else f"pid {who.get('pid', '?')} on {who.get('hostname', '?')}"
        return f"{'another' if other else 'a'} training run ({which}) is in progress"
    if who.get("job") and who.get("brief"):
        return (f"{who['job']} was {who.get('doing') or 'holding the training lock'} and still held the training "
                f"lock after {patience:g} s (pid {who.get('pid', '?')})")
    if who.get("job"):
        return f"{who['job']} holds the training lock ({who.get('doing') or 'pid ' + str(who.get('pid', '?'))})"
    busy = db.session.scalars(db.select(TrainingRun).where(TrainingRun.status.in_(("queued", "running")))
                              .order_by(TrainingRun.id.desc())).first()
    marked = f"; run #{busy.id} is marked {busy.status}" if busy else ""
    return f"another process holds the training lock without saying what it is doing{marked}"


# A queued run's child takes the lock a few seconds after its row is written (interpreter and
# ML imports); until then the row is not stale.
QUEUED_GRACE_SECONDS = 120.0


def _about_to_start(run: TrainingRun) -> bool:
    """A queued run whose rl-train child is alive on this host, or just written and not started
    yet: holding the lock before it does proves nothing about it."""
    if run.status != "queued":
        return False
    if run.pid and run.hostname == socket.gethostname():
        return _pid_is_training(run.pid)
    return (utcnow() - run.created_at).total_seconds() < QUEUED_GRACE_SECONDS


def recover_stale_runs(keep: int | None = None) -> list[int]:
    """Runs still marked running/queued while we hold the lock belong to dead processes (except
    ``keep``: the queued run the caller is about to take over, and queued runs whose child has
    not taken the lock yet)."""
    stale = [r for r in db.session.scalars(db.select(TrainingRun).where(TrainingRun.status.in_(("running", "queued"))))
             if r.id != keep and not _about_to_start(r)]
    for run in stale:
        run.status = "failed"
        run.error = (f"process {run.pid} on {run.hostname} died during stage {run.stage or 'start'} "
                     "(recovered by a later run)")
        run.finished_at = utcnow()
    db.session.commit()
    return [r.id for r in stale]


def next_version_name(kind: str) -> str:
    """``v<N>-<kind>``, N above every version in the database and in the store."""
    import re

    names = list(db.session.scalars(db.select(ModelVersion.name)))
    store = Path(current_app.config["MODEL_STORE"])
    names += [p.name for p in store.iterdir()] if store.is_dir() else []
    numbers = [int(m.group(1)) for n in names if (m := re.match(r"^v(\d+)-", n))]
    return f"v{max(numbers, default=0) + 1}-{kind}"


def run_folder(run_id: int) -> Path:
    """A run's own folder in the instance: its training curves, TensorBoard files and reward model."""
    return Path(current_app.config["INSTANCE_DIR"]) / "runs" / f"run-{run_id}"


def curves_path(run_id: int) -> Path:
    """The run's training curves (JSON lines, rlhf.training.curves), written while it trains."""
    return run_folder(run_id) / "curves.jsonl"


# ---------------------------------------------------------------------------- runs started by the web app

def training_command(args: list[str]) -> list[str]:
    """The command line of a training child: ``flask --app webapp <args>`` in this interpreter, or,
    with RLHF_TRAIN_PROCESSES > 1, the same under ``accelerate launch`` on that many processes
    (RLHF_ACCELERATE_CONFIG, or the bundled CPU or GPU data-parallel config for the device)."""
    cfg = current_app.config
    flask_args = ["flask", "--app", "webapp", *args]
    processes = int(cfg["RLHF_TRAIN_PROCESSES"])
    if processes <= 1:
        return [sys.executable, "-m", *flask_args]
    config = cfg["RLHF_ACCELERATE_CONFIG"] and ROOT / cfg["RLHF_ACCELERATE_CONFIG"]  # an absolute path stays one
    if not config:
        from rlhf.models.loading import resolve_device

        config = distributed.default_config(cpu=resolve_device(cfg["RLHF_DEVICE"]).type == "cpu")
    return distributed.launch_command(flask_args, processes, config, sys.executable)


def _reap(proc: subprocess.Popen) -> None:
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()


def spawn_training(algorithm: str | None = None, max_steps: int | None = None, trigger: str = "manual",
                   min_feedback: int | None = None) -> tuple[int, subprocess.Popen]:
    """Start ``rl-train`` in a child process (its own process group, so the watchdog can stop
    all of it) for a run row written first as ``queued``: the dashboard shows the run at once.
    A thread waits for the child, so a finished run never lingers as a zombie. Returns the run
    id and the process."""
    instance = Path(current_app.config["INSTANCE_DIR"])
    # the row names the configured algorithm until the run starts; the run may size it to the model
    run = TrainingRun(trigger=trigger, algorithm=algorithm or current_app.config["RLHF_SETTINGS"].training.algorithm,
                      status="queued", stage="queued", progress=0.0, hostname=socket.gethostname())
    db.session.add(run)
    db.session.commit()
    log_dir = instance / "logs"
    log_dir.mkdir(exist_ok=True)
    args = ["rl-train", *(["--algorithm", algorithm] if algorithm else []), "--trigger", trigger,
            "--run-id", str(run.id), "--json"]
    if max_steps:
        args += ["--max-steps", str(max_steps)]
    if min_feedback is not None:
        args += ["--min-feedback", str(min_feedback)]
    cmd = training_command(args)
    env = {**os.environ, "RLHF_INSTANCE_DIR": str(instance)}
    if current_app.config.get("SQLALCHEMY_DATABASE_URI"):
        env["DATABASE_URL"] = current_app.config["SQLALCHEMY_DATABASE_URI"]
    try:
        with open(log_dir / "training.log", "ab") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log,
                                    start_new_session=True)
    except OSError as exc:
        run.status, run.finished_at, run.error = "failed", utcnow(), f"could not start rl-train: {exc}"
        db.session.commit()
        raise
    run.pid = proc.pid
    db.session.commit()
    _reap(proc)
    return run.id, proc


def _pid_is_training(pid: int) -> bool:
    """True if ``pid`` is alive (not a zombie) and is an ``rl-train`` process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():  # no procfs: trust the pid
        return True
    try:
        if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        return b"rl-train" in proc.joinpath("cmdline").read_bytes()
    except (OSError, IndexError):
        return False
