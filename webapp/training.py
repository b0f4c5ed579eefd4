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
import socket
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from flask import current_app
from sqlalchemy import or_

from rlhf import registry
from rlhf.cycle import CycleSettings, NotEnoughData, overall_progress, prepare_data, run_cycle
from rlhf.evaluation import GateThresholds
from rlhf.policy_training import ALGORITHMS, PolicySettings
from rlhf.records import ComparisonRecord, ConversationRecord, FeedbackRecord, MessageRecord
from rlhf.redaction import redact_records

from .bootstrap import active_version
from .extensions import db
from .models import Comparison, Conversation, Feedback, Message, ModelVersion, TrainingRun, utcnow

ProgressFn = Callable[[str, int, int], None]

# Exit codes of `rl-train` (documented in the README).
EXIT_OK, EXIT_REFUSED, EXIT_GATE_REJECTED, EXIT_FAILED = 0, 2, 3, 1


class RunRefused(Exception):
    """The run cannot start; the message is the one-line reason."""


# ---------------------------------------------------------------------------- reading feedback

def feedback_event_count() -> int:
    """Feedback events available for training: feedback rows carrying any signal plus voted
    comparisons, in conversations that were not deleted."""
    live = db.select(Conversation.id).where(Conversation.deleted_at.is_(None))
    fb = db.session.scalar(db.select(db.func.count(Feedback.id)).join(Message, Feedback.message_id == Message.id)
                           .where(Message.conversation_id.in_(live))
                           .where(or_(Feedback.thumb.is_not(None), Feedback.rating.is_not(None),
                                      Feedback.correction.is_not(None))))
    votes = db.session.scalar(db.select(db.func.count(Comparison.id))
                              .join(Message, Comparison.prompt_message_id == Message.id)
                              .where(Message.conversation_id.in_(live)).where(Comparison.winner.is_not(None)))
    return int(fb or 0) + int(votes or 0)


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

    from rlhf.preference_data import build_datasets

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


def recover_stale_runs() -> list[int]:
    """Runs still marked running/queued while we hold the lock belong to dead processes."""
    stale = db.session.scalars(db.select(TrainingRun).where(TrainingRun.status.in_(("running", "queued")))).all()
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
    try:
        return settings.validate()
    except ValueError as exc:
        raise RunRefused(f"invalid setting: {exc}") from None


# ---------------------------------------------------------------------------- progress

class RunTracker:
    """Receives stage progress: draws it (optional ``bars``) and stores it on the run row,
    throttled, together with a heartbeat; collects log lines."""

    def __init__(self, run_id: int, bars: ProgressFn | None = None, min_interval: float = 1.0) -> None:
        self.run_id, self.bars, self.min_interval = run_id, bars, min_interval
        self._last = 0.0
        self._stage: str | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.bars:
            self.bars(stage, done, total)
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
                 **overrides: Any) -> dict[str, Any]:
    """One full cycle as a training_runs row. Raises RunRefused (nothing stored) when it cannot
    start; any failure after that marks the run failed and leaves the active version alone."""
    settings = cycle_settings(algorithm, max_steps, lora, **overrides)
    cfg = current_app.config
    min_feedback = int(cfg["RLHF_RETRAIN_MIN_FEEDBACK"] if min_feedback is None else min_feedback)
    if min_feedback < 0:
        raise RunRefused(f"invalid setting: --min-feedback must be >= 0 (got {min_feedback})")

    with training_lock():
        recovered = recover_stale_runs()
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
            bundle = prepare_data(records, settings)
        except NotEnoughData as exc:
            raise RunRefused(str(exc)) from None

        run = TrainingRun(trigger=trigger, algorithm=algorithm, status="running", stage="data", progress=0.0,
                          pid=os.getpid(), hostname=socket.gethostname(), started_at=utcnow(), heartbeat_at=utcnow(),
                          feedback_counts={"events": events, **bundle.counts}, config=settings.to_dict())
        db.session.add(run)
        db.session.commit()
        run_id, parent_id, parent_name, parent_path = run.id, parent.id, parent.name, parent.path
        tracker = RunTracker(run_id, bars)
        if recovered:
            tracker.log(f"recovered stale runs {recovered}: marked failed")
        tracker.log(f"parent {parent_name}; {events} feedback events; algorithm {algorithm}")

        instance = Path(cfg["INSTANCE_DIR"])
        workdir = instance / "runs" / f".tmp-run-{run_id}"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        created_paths: list[Path] = []  # removed again if the run fails before it is recorded
        try:
            result = run_cycle(records, parent_path, workdir / "reward", workdir / "policy", settings,
                               progress=tracker, log=tracker.log, bundle=bundle)
            reward_path = instance / "runs" / f"run-{run_id}" / "reward_model"
            reward_path.parent.mkdir(parents=True, exist_ok=True)
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
            shutil.rmtree(workdir, ignore_errors=True)


def summary(run: TrainingRun, version: ModelVersion | None) -> dict[str, Any]:
    """The `rl-train --json` object (DESIGN.md "CLI contract")."""
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
