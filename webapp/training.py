"""Training runs: read feedback from the database, run ``rlhf.cycle`` and record the outcome.

Only one run at a time per instance: the run holds an exclusive ``flock`` on
``<instance>/training.lock`` for its whole life. The kernel drops the lock when the process
dies, so a run left "running" by a killed process is recognised (and marked failed) by the
next run that gets the lock -- no lock file ever has to be cleaned up by hand.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Iterator

from flask import current_app
from sqlalchemy import or_

from rlhf import registry
from rlhf.curves import CurvesFile, TrainingLogs
from rlhf.cycle import CycleSettings, NotEnoughData, fit_to_data, overall_progress, run_cycle
from rlhf.preference_data import build_datasets
from rlhf.evaluation import GateThresholds
from rlhf.policy_training import ALGORITHMS, PolicySettings
from rlhf.records import ComparisonRecord, ConversationRecord, FeedbackRecord, MessageRecord
from rlhf.redaction import redact_records
from rlhf.stage_sizing import DataSize

from .bootstrap import active_version
from .extensions import db
from .models import Comparison, Conversation, Feedback, Message, ModelVersion, TrainingRun, utcnow

ProgressFn = Callable[[str, int, int], None]

# Exit codes of `rl-train` (documented in the README).
EXIT_OK, EXIT_REFUSED, EXIT_GATE_REJECTED, EXIT_FAILED = 0, 2, 3, 1


class RunRefused(Exception):
    """The run cannot start; the message is the one-line reason."""


# ---------------------------------------------------------------------------- reading feedback

def feedback_events(since: datetime | None = None) -> dict[str, int]:
    """The one definition of a *feedback event*, used by training, the scheduler and the
    dashboard alike: a feedback row carrying a thumb, a rating or a correction (one event per
    rated answer, however many of the three it carries), plus each voted side-by-side
    comparison, in conversations that were not deleted. ``since``: only those written after it.

    Returns the breakdown (``thumbs``/``ratings``/``corrections`` count rows carrying each, so
    they can overlap), ``rated_answers`` (rows carrying any), ``votes`` and ``total``."""
    live = db.select(Conversation.id).where(Conversation.deleted_at.is_(None))
    has = {"thumbs": Feedback.thumb.is_not(None), "ratings": Feedback.rating.is_not(None),
           "corrections": Feedback.correction.is_not(None)}
    cols = [db.func.count(Feedback.id)] + [db.func.count(db.case((cond, 1))) for cond in has.values()]
    fb = (db.select(*cols).join(Message, Feedback.message_id == Message.id)
          .where(Message.conversation_id.in_(live)).where(or_(*has.values())))
    votes = (db.select(db.func.count(Comparison.id)).join(Message, Comparison.prompt_message_id == Message.id)
             .where(Message.conversation_id.in_(live)).where(Comparison.winner.is_not(None)))
    if since is not None:
        fb = fb.where(Feedback.updated_at > since)
        votes = votes.where(Comparison.voted_at > since)
    rated, *parts = db.session.execute(fb).one()
    n_votes = int(db.session.scalar(votes) or 0)
    return {"rated_answers": int(rated or 0), **{k: int(v or 0) for k, v in zip(has, parts)},
            "votes": n_votes, "total": int(rated or 0) + n_votes}


def feedback_event_count(since: datetime | None = None) -> int:
    """Feedback events available for training (see :func:`feedback_events`)."""
    return feedback_events(since)["total"]


def feedback_records(redact: bool = True) -> list[ConversationRecord]:
    """Every live conversation as plain records, with the owner's feedback and votes.
    Deleted conversations are left out, so deleting one removes it from future training.
    ``redact``: e-mail addresses and phone numbers in message texts, corrections and comments
    are replaced by ``[EMAIL]``/``[PHONE]`` (rlhf.redaction), for training and exports alike."""
    convs = db.session.execute(db.select(Conversation.id, Conversation.user_id)
                               .where(Conversation.deleted_at.is_(None)).order_by(Conversation.id)).all()
    owner = {cid: uid for cid, uid in convs}
    messages: dict[int, list[Message]] = {cid: [] for cid in owner}
    for m in db.session.scalars(db.select(Message).where(Message.conversation_id.in_(list(owner)))
                                .order_by(Message.id)):
        messages[m.conversation_id].append(m)
    msg_conv = {m.id: cid for cid, ms in messages.items() for m in ms}
    feedback: dict[int, FeedbackRecord] = {}
    for f in db.session.scalars(db.select(Feedback).where(Feedback.message_id.in_(list(msg_conv)))):
        if owner.get(msg_conv.get(f.message_id)) == f.user_id:
            feedback[f.message_id] = FeedbackRecord(f.thumb, f.rating, f.correction, f.comment,
                                                    tuple(f.reasons or ()))
    comparisons: dict[int, list[ComparisonRecord]] = {cid: [] for cid in owner}
    for c in db.session.scalars(db.select(Comparison).where(Comparison.prompt_message_id.in_(list(msg_conv)))):
        comparisons[msg_conv[c.prompt_message_id]].append(
            ComparisonRecord(c.id, c.prompt_message_id, c.message_a_id, c.message_b_id, c.winner))
    versions = {v.id: v.name for v in db.session.scalars(db.select(ModelVersion))}
    records = [ConversationRecord(
        id=cid, user_id=owner[cid], comparisons=tuple(comparisons[cid]),
        messages=tuple(MessageRecord(m.id, m.role, m.content, m.parent_id, feedback.get(m.id),
                                     versions.get(m.model_version_id)) for m in messages[cid]))
        for cid in owner if messages[cid]]
    return redact_records(records) if redact else records


EXPORT_FORMATS = ("pairs", "kto", "sft", "raw")


def export_rows(fmt: str, redact: bool = True) -> list[dict[str, Any]]:
    """Rows for ``export-feedback`` / the admin export: TRL columns plus ``split``; or raw
    conversations. Deleted conversations are never included. ``redact`` (the default): e-mail
    addresses and phone numbers in every text are replaced (see feedback_records)."""
    from dataclasses import asdict

    records = feedback_records(redact=redact)
    if fmt == "raw":
        return [asdict(r) for r in records]
    data = getattr(build_datasets(records), fmt)
    return [{**row, "split": split} for split in ("train", "eval") for row in data[split]]


# ---------------------------------------------------------------------------- the lock

@contextmanager
def training_lock() -> Iterator[None]:
    path = Path(current_app.config["INSTANCE_DIR"]) / "training.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            running = db.session.scalars(db.select(TrainingRun).filter_by(status="running")
                                         .order_by(TrainingRun.id.desc())).first()
            detail = f" (run #{running.id}, pid {running.pid}, stage {running.stage})" if running else ""
            raise RunRefused(f"another training run is in progress{detail}") from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def recover_stale_runs(keep: int | None = None) -> list[int]:
    """Runs still marked running/queued while we hold the lock belong to dead processes (except
    ``keep``: the queued run the caller is about to take over)."""
    stale = [r for r in db.session.scalars(db.select(TrainingRun).where(TrainingRun.status.in_(("running", "queued"))))
             if r.id != keep]
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


# ---------------------------------------------------------------------------- settings

def cycle_settings(algorithm: str = "ppo", max_steps: int | None = None, lora: bool | None = None,
                   **overrides: Any) -> CycleSettings:
    """Cycle settings from the app config (RLHF_* keys) plus explicit overrides."""
    cfg = current_app.config
    if algorithm not in ALGORITHMS:
        raise RunRefused(f"invalid setting: --algorithm {algorithm!r} (choose from {', '.join(ALGORITHMS)})")
    if max_steps is not None and max_steps < 1:
        raise RunRefused(f"invalid setting: --max-steps must be at least 1 (got {max_steps})")
    policy = replace(PolicySettings(), episodes=int(cfg["RLHF_PPO_EPISODES"]),
                     learning_rate=float(cfg["RLHF_POLICY_LR"]), kl_coef=float(cfg["RLHF_KL_COEF"]),
                     max_steps=max_steps, lora=bool(cfg["RLHF_LORA"] if lora is None else lora))
    gate = replace(GateThresholds(), min_reward_gain=float(cfg["RLHF_GATE_MIN_REWARD_GAIN"]),
                   max_kl=float(cfg["RLHF_GATE_MAX_KL"]))
    settings = CycleSettings(algorithm=algorithm, policy=policy, gate=gate, device=cfg["RLHF_DEVICE"],
                             min_pairs=int(cfg["RLHF_MIN_PAIRS"]))
    settings = replace(settings, **overrides)
    if cfg["RLHF_TENSORBOARD"] and not tensorboard_available():
        raise RunRefused("RLHF_TENSORBOARD=1 needs the tensorboard package, which is not installed "
                         "(pip install -e '.[tensorboard]', or set RLHF_TENSORBOARD=0)")
    try:
        return settings.validate()
    except ValueError as exc:
        raise RunRefused(f"invalid setting: {exc}") from None


def tensorboard_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def run_folder(run_id: int) -> Path:
    """A run's own folder in the instance: its training curves, TensorBoard files and reward model."""
    return Path(current_app.config["INSTANCE_DIR"]) / "runs" / f"run-{run_id}"


def curves_path(run_id: int) -> Path:
    """The run's training curves (JSON lines, rlhf.curves), written while it trains."""
    return run_folder(run_id) / "curves.jsonl"


# ---------------------------------------------------------------------------- progress

class RunTracker:
    """Receives stage progress: draws it (optional ``bars``) and stores it on the run row,
    throttled, together with a heartbeat; collects log lines."""

    def __init__(self, run_id: int, bars: ProgressFn | None = None, min_interval: float = 1.0,
                 watchdog: "RunWatchdog | None" = None) -> None:
        self.run_id, self.bars, self.min_interval, self.watchdog = run_id, bars, min_interval, watchdog
        self._last = 0.0
        self._stage: str | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.bars:
            self.bars(stage, done, total)
        if self.watchdog:
            self.watchdog.beat(stage)
        now = time.monotonic()
        if stage != self._stage or done >= total or now - self._last >= self.min_interval:
            self._stage, self._last = stage, now
            db.session.execute(db.update(TrainingRun).where(TrainingRun.id == self.run_id).values(
                stage=stage, progress=round(overall_progress(stage, done, total), 4), heartbeat_at=utcnow()))
            db.session.commit()

    def log(self, line: str) -> None:
        run = db.session.get(TrainingRun, self.run_id)
        run.log = (run.log or "") + f"[{utcnow().strftime('%H:%M:%S')}] {line}\n"
        db.session.commit()


# ---------------------------------------------------------------------------- the run

def run_training(trigger: str = "cli", algorithm: str = "ppo", min_feedback: int | None = None,
                 max_steps: int | None = None, lora: bool | None = None, bars: ProgressFn | None = None,
                 run_id: int | None = None, watchdog: bool = False, **overrides: Any) -> dict[str, Any]:
    """One full cycle as a training_runs row. Raises RunRefused (nothing stored) when it cannot
    start; any failure after that marks the run failed and leaves the active version alone.

    ``run_id``: a row ``spawn_training`` wrote as queued; this run takes it over (a refusal marks
    it failed with the reason). ``watchdog``: stop this process when the run stalls or overruns
    its limits (``rl-train`` sets it; see :class:`RunWatchdog`)."""
    try:
        return _run_training(trigger, algorithm, min_feedback, max_steps, lora, bars, run_id, watchdog, overrides)
    except RunRefused as exc:
        if run_id is not None:
            db.session.rollback()
            queued = db.session.get(TrainingRun, run_id)
            if queued is not None and queued.status == "queued":
                queued.status, queued.finished_at = "failed", utcnow()
                queued.error = f"refused to start: {exc}"
                db.session.commit()
        raise


def _run_training(trigger: str, algorithm: str, min_feedback: int | None, max_steps: int | None,
                  lora: bool | None, bars: ProgressFn | None, queued_id: int | None, watchdog: bool,
                  overrides: dict[str, Any]) -> dict[str, Any]:
    settings = cycle_settings(algorithm, max_steps, lora, **overrides)
    cfg = current_app.config
    min_feedback = int(cfg["RLHF_RETRAIN_MIN_FEEDBACK"] if min_feedback is None else min_feedback)
    if min_feedback < 0:
        raise RunRefused(f"invalid setting: --min-feedback must be >= 0 (got {min_feedback})")

    with training_lock():
        recovered = recover_stale_runs(keep=queued_id)
        for stale in recovered:  # their work directories died with them (only runs write them; we hold the lock)
            shutil.rmtree(Path(cfg["INSTANCE_DIR"]) / "runs" / f".tmp-run-{stale}", ignore_errors=True)
        parent = active_version()
        if parent is None or not registry.is_complete(parent.path):
            raise RunRefused("no usable active model version; run `flask --app webapp init-model` first")
        events = feedback_event_count()
        if events < min_feedback:
            raise RunRefused(f"not enough feedback yet: {events} feedback events, need at least {min_feedback}")
        records = feedback_records()
        try:
            bundle = build_datasets(records, settings.data)
            settings, sizing_notes = fit_to_data(settings, bundle)  # NotEnoughData before any run exists
        except NotEnoughData as exc:
            raise RunRefused(str(exc)) from None
        limits = run_limits(settings, DataSize.of(bundle), parent.path)

        run = db.session.get(TrainingRun, queued_id) if queued_id is not None else None
        if run is None:
            run = TrainingRun(trigger=trigger, algorithm=algorithm)
            db.session.add(run)
        run.status, run.stage, run.progress = "running", "data", 0.0
        run.pid, run.hostname, run.started_at, run.heartbeat_at = os.getpid(), socket.gethostname(), utcnow(), utcnow()
        run.feedback_counts = {"events": events, **bundle.counts}
        run.config = {**settings.to_dict(), "limits": limits}
        db.session.commit()
        run_id, parent_id, parent_name, parent_path = run.id, parent.id, parent.name, parent.path
        guard = RunWatchdog(current_app._get_current_object(), run_id, limits).start() if watchdog else None
        tracker = RunTracker(run_id, bars, watchdog=guard)
        if recovered:
            tracker.log(f"recovered stale runs {recovered}: marked failed")
        tracker.log(f"parent {parent_name}; {events} feedback events; algorithm {algorithm}")
        for note in sizing_notes:
            tracker.log(f"sized to the data: {note}")
        tracker.log(f"limits: stopped after {limits['stall_seconds']:.0f} s without progress or "
                    f"{limits['max_seconds']:.0f} s in all")

        instance = Path(cfg["INSTANCE_DIR"])
        workdir = instance / "runs" / f".tmp-run-{run_id}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        created_paths: list[Path] = []  # removed again if the run fails before it is recorded
        # The run's folder outlives its work directory: the curves are written there as it trains
        # (and stay, for a failed run too).
        folder = run_folder(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        curves_path(run_id).unlink(missing_ok=True)  # a queued run taken over again starts afresh
        logs = TrainingLogs(metrics=CurvesFile(curves_path(run_id)),
                            tensorboard_dir=str(folder / "tensorboard") if cfg["RLHF_TENSORBOARD"] else None)
        if logs.tensorboard_dir:
            tracker.log(f"TensorBoard event files: {Path(logs.tensorboard_dir).relative_to(instance)}")
        try:
            result = run_cycle(records, parent_path, workdir / "reward", workdir / "policy", settings,
                               progress=tracker, log=tracker.log, bundle=bundle, logs=logs)
            reward_path = folder / "reward_model"
            os.rename(workdir / "reward", reward_path)

            status = "candidate" if result.passed else "failed"
            metrics = {"reward_model": result.reward, "policy": result.policy, "evaluation": result.evaluation,
                       "counts": result.counts, "timings": result.timings, "peak_rss_mb": result.peak_rss_mb,
                       "reward_model_path": str(reward_path)}

            def move_policy(tmp: Path) -> dict:
                for item in (workdir / "policy").iterdir():
                    os.rename(item, tmp / item.name)
                return {"evaluation": {k: result.evaluation[k] for k in
                                       ("passed", "reasons", "reward_gain", "kl_from_parent")}}

            name, path, _ = registry.write_version(
                cfg["MODEL_STORE"], algorithm, move_policy, name=next_version_name(algorithm),
                lineage={"parent": parent_name, "training_run": run_id, "algorithm": algorithm,
                         "data_counts": result.counts, "config": settings.to_dict(),
                         "reward_model": str(reward_path)})
            created_paths.append(path)
            version = ModelVersion(name=name, path=str(path), parent_id=parent_id, kind=algorithm, status=status,
                                   training_run_id=run_id, metrics=metrics, config=settings.to_dict())
            db.session.add(version)
            db.session.flush()
            run = db.session.get(TrainingRun, run_id)
            run.status, run.progress, run.stage = "succeeded", 1.0, "done"
            run.version_id = version.id
            decision = "candidate" if result.passed else "rejected_by_gate"
            run.metrics = {**metrics, "decision": decision, "version": name}
            run.finished_at = utcnow()
            db.session.commit()
            tracker.log(f"registered {name} as {status}" + ("" if result.passed else
                                                          f": {'; '.join(result.evaluation['reasons'])}"))
            return summary(run, version)
        except BaseException as exc:  # includes KeyboardInterrupt: the run is failed, nothing else changes
            db.session.rollback()
            for p in created_paths:
                shutil.rmtree(p, ignore_errors=True)
            run = db.session.get(TrainingRun, run_id)
            run.status, run.finished_at = "failed", utcnow()
            run.error = f"{type(exc).__name__}: {exc}".strip()[:2000]
            db.session.commit()
            raise
        finally:
            if guard:
                guard.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def summary(run: TrainingRun, version: ModelVersion | None) -> dict[str, Any]:
    """The `rl-train --json` object (README, CLI)."""
    m = run.metrics or {}
    ev = m.get("evaluation", {})
    return {
        "run_id": run.id, "status": run.status, "algorithm": run.algorithm, "trigger": run.trigger,
        "data_counts": run.feedback_counts,
        "reward_model": {k: m.get("reward_model", {}).get(k) for k in
                         ("heldout_accuracy", "train_accuracy", "train_pairs", "eval_pairs", "steps", "train_loss")}
        | {"path": m.get("reward_model_path")},
        "policy": m.get("policy"),
        "evaluation": {"before": ev.get("parent"), "after": ev.get("candidate"), "reward_gain": ev.get("reward_gain"),
                       "kl_from_parent": ev.get("kl_from_parent"), "passed": ev.get("passed"),
                       "reasons": ev.get("reasons"), "prompts": ev.get("prompts")},
        "version": ({"id": version.id, "name": version.name, "status": version.status, "path": version.path,
                     "parent": version.parent.name if version.parent else None} if version else None),
        "decision": m.get("decision"),
        "timings_s": m.get("timings"),
        "peak_rss_mb": m.get("peak_rss_mb"),
        "error": run.error,
    }


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


# ---------------------------------------------------------------------------- limits and the watchdog

def model_megaparameters(path: str | Path) -> float:
    """Roughly how many million parameters a stored model has (from its weight files' size)."""
    files = [f for pattern in ("*.safetensors", "*.bin") for f in Path(path).glob(pattern)]
    return sum(f.stat().st_size for f in files) / 4 / 1e6  # fp32 bytes per parameter


def auto_max_seconds(settings: CycleSettings, size: DataSize, parent_path: str | Path) -> float:
    """A run's time limit when RLHF_RUN_MAX_SECONDS is 0: 30 minutes, plus 2 s per unit of
    training work (a PPO/RLOO episode, a DPO/KTO row per epoch, a reward pair per epoch), scaled
    up for models above 10 M parameters. Generous on purpose: a cycle on the embedded model does
    about 700 units in ~1 minute on 2 idle cores; the limit only catches runs that will never end
    (a run that stops making progress is caught much sooner by the stall limit)."""
    p = settings.policy
    if settings.algorithm in ("ppo", "rloo"):
        policy_units = min(p.episodes, p.max_steps * p.batch_size) if p.max_steps else p.episodes
    else:
        rows = size.train_pairs if settings.algorithm == "dpo" else size.kto_good + size.kto_bad
        policy_units = rows * p.epochs
    units = policy_units + size.train_pairs * settings.reward.epochs + settings.evaluation.max_prompts
    return round(1800.0 + 2.0 * units * max(1.0, model_megaparameters(parent_path) / 10.0))


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
            what = "never started" if run.status == "queued" else f"no progress for {quiet:.0f} s during stage {run.stage}"
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


# ---------------------------------------------------------------------------- runs started by the web app

def _reap(proc: subprocess.Popen) -> None:
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()


def spawn_training(algorithm: str = "ppo", max_steps: int | None = None, trigger: str = "manual",
                   min_feedback: int | None = None) -> tuple[int, subprocess.Popen]:
    """Start ``rl-train`` in a child process (its own process group, so the watchdog can stop
    all of it) for a run row written first as ``queued``: the dashboard shows the run at once.
    A thread waits for the child, so a finished run never lingers as a zombie. Returns the run
    id and the process."""
    instance = Path(current_app.config["INSTANCE_DIR"])
    run = TrainingRun(trigger=trigger, algorithm=algorithm, status="queued", stage="queued", progress=0.0,
                      hostname=socket.gethostname())
    db.session.add(run)
    db.session.commit()
    log_dir = instance / "logs"
    log_dir.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "flask", "--app", "webapp", "rl-train", "--algorithm", algorithm,
           "--trigger", trigger, "--run-id", str(run.id), "--json"]
    if max_steps:
        cmd += ["--max-steps", str(max_steps)]
    if min_feedback is not None:
        cmd += ["--min-feedback", str(min_feedback)]
    env = {**os.environ, "RLHF_INSTANCE_DIR": str(instance)}
    if current_app.config.get("SQLALCHEMY_DATABASE_URI"):
        env["DATABASE_URL"] = current_app.config["SQLALCHEMY_DATABASE_URI"]
    try:
        with open(log_dir / "training.log", "ab") as log:
            proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], env=env, stdout=log, stderr=log,
                                    start_new_session=True)
    except OSError as exc:
        run.status, run.finished_at, run.error = "failed", utcnow(), f"could not start rl-train: {exc}"
        db.session.commit()
        raise
    run.pid = proc.pid
    db.session.commit()
    _reap(proc)
    return run.id, proc
