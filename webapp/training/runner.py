"""One training run in this process (``rl-train``): the cycle's settings from the app's settings,
the run's row kept up to date (stage, progress, heartbeat, log), ``rlhf.cycle`` run on the
feedback records, and the outcome recorded (a new candidate version, or why not)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from flask import current_app

from rlhf.algorithms import ALGORITHMS
from rlhf.cycle import CycleJob, CycleSettings, NotEnoughData, overall_progress, prepare_cycle, run_prepared
from rlhf.data.stage_sizing import DataSize
from rlhf.models import registry
from rlhf.models.size_settings import parameter_count, sized_to_model
from rlhf.policy.algorithms import check_settings
from rlhf.progress import ProgressFn
from rlhf.training import distributed
from rlhf.training.curves import CurvesFile, TrainingLogs
from rlhf.trust import RaterInfo
from webapp.core.extensions import db
from webapp.core.instance_paths import resolve, to_stored
from webapp.core.models import ModelVersion, TrainingRun, active_version, utcnow
from webapp.core.raters import store_assessments
from webapp.core.settings import current_settings
from webapp.training.model_size import sized_setting
from webapp.training.records import feedback_event_count, feedback_records, rater_infos
from webapp.training.runs import (
    RunRefused,
    curves_path,
    next_version_name,
    recover_stale_runs,
    run_folder,
    training_lock,
)
from webapp.training.watchdog import RunWatchdog, run_limits


def cycle_settings(algorithm: str | None = None, max_steps: int | None = None, lora: bool | None = None,
                   **overrides: Any) -> CycleSettings:
    """The app's training settings (``current_settings().training``: every field settable in the
    settings file and environment) with this run's choices (rl-train's options) on top."""
    cfg = current_app.config
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise RunRefused(f"invalid setting: --algorithm {algorithm!r} (choose from {', '.join(ALGORITHMS)})")
    if max_steps is not None and max_steps < 1:
        raise RunRefused(f"invalid setting: --max-steps must be at least 1 (got {max_steps})")
    settings = sampled_as_served(current_settings().training)
    policy = settings.policy
    if max_steps is not None:
        policy = replace(policy, max_steps=max_steps)
    if lora is not None:
        policy = replace(policy, lora=lora)
    settings = replace(settings, algorithm=algorithm or settings.algorithm, policy=policy, **overrides)
    if cfg["RLHF_TENSORBOARD"] and not tensorboard_available():
        raise RunRefused("RLHF_TENSORBOARD=1 needs the tensorboard package, which is not installed "
                         "(pip install -e '.[tensorboard]', or set RLHF_TENSORBOARD=0)")
    try:
        return check_settings(settings)
    except ValueError as exc:
        raise RunRefused(f"invalid setting: {exc}") from None


def sampled_as_served(settings: CycleSettings) -> CycleSettings:
    """``settings`` whose gate samples at the server's temperature and ``top_p``, and whose iterative
    DPO at its ``top_p``, except where the operator set the training value: the loop judges and
    pairs answers as users get them. (Iterative DPO keeps its own temperature, PPO's: at the
    quickstart's served 0.2 its samples would rarely differ enough to rank.)"""
    served, explicit = current_settings(), operator_set()
    evaluation, policy = settings.evaluation, settings.policy
    if "evaluation.temperature" not in explicit:
        evaluation = replace(evaluation, temperature=served.temperature)
    if "evaluation.top_p" not in explicit:
        evaluation = replace(evaluation, top_p=served.top_p)
    if "policy.top_p" not in explicit:
        policy = replace(policy, top_p=served.top_p)
    return replace(settings, evaluation=evaluation, policy=policy)


def operator_set() -> set[str]:
    """The training settings the operator set (settings file, environment), as dotted names below
    ``training.`` (``policy.top_p``): the ones the app never fills in for them."""
    sources = current_app.config.get("RLHF_SETTING_SOURCES", {})
    return {name.removeprefix("training.") for name in sources if name.startswith("training.")}


def _sized_to_parent(settings: CycleSettings, parent: str | Path, algorithm: str | None,
                     lora: bool | None) -> tuple[CycleSettings, list[str]]:
    """``settings`` for the parent's size (rlhf.models.size_settings: a 100 M-parameter model trains its
    reward model's top blocks and a LoRA policy by iterative DPO), keeping every training setting the
    operator set (settings file, environment, ``rl-train --algorithm/--lora``)."""
    explicit = operator_set()
    if algorithm is not None:
        explicit.add("algorithm")
    if lora is not None:
        explicit.add("policy.lora")
    sized, notes = sized_to_model(settings, parameter_count(parent), explicit)
    try:
        return check_settings(sized), notes
    except ValueError as exc:
        raise RunRefused(f"invalid setting: {exc} (with the settings for the model's size: {'; '.join(notes)})") \
            from None


def tensorboard_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


class RunTracker:
    """Receives stage progress: draws it (optional ``bars``) and stores it on the run row,
    throttled, together with a heartbeat; collects log lines."""

    def __init__(self, run_id: int, bars: ProgressFn | None = None, min_interval: float = 1.0,
                 watchdog: "RunWatchdog | None" = None) -> None:
        self.run_id, self.bars, self.min_interval, self.watchdog = run_id, bars, min_interval, watchdog
        self._last = 0.0
        self._stage: str | None = None
        self._stage_started = utcnow()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.bars:
            self.bars(stage, done, total)
        if self.watchdog:
            self.watchdog.beat(stage)
        now = time.monotonic()
        if stage != self._stage or done >= total or now - self._last >= self.min_interval:
            moved = stage != self._stage
            if moved:  # the stage's clock starts at its first report (webapp.training.eta)
                self._stage_started = utcnow()
            self._stage, self._last = stage, now
            db.session.execute(db.update(TrainingRun).where(TrainingRun.id == self.run_id).values(
                stage=stage, progress=round(overall_progress(stage, done, total), 4), heartbeat_at=utcnow(),
                stage_started_at=self._stage_started, stage_done=done, stage_total=total))
            db.session.commit()

    def log(self, line: str) -> None:
        run = db.session.get(TrainingRun, self.run_id)
        run.log = (run.log or "") + f"[{utcnow().strftime('%H:%M:%S')}] {line}\n"
        db.session.commit()


def known_raters() -> dict[int, RaterInfo]:
    """What the database knows of every rater (admin trust setting, account age, history)."""
    return {uid: RaterInfo(rater=uid, **info) for uid, info in rater_infos().items()}


def run_training(trigger: str = "cli", algorithm: str | None = None, min_feedback: int | None = None,
                 max_steps: int | None = None, lora: bool | None = None, bars: ProgressFn | None = None,
                 run_id: int | None = None, watchdog: bool = False, **overrides: Any) -> dict[str, Any]:
    """One full cycle as a training_runs row. Raises RunRefused (nothing stored) when it cannot
    start; any failure after that marks the run failed and leaves the active version alone.

    ``run_id``: a row ``spawn_training`` wrote as queued; this run takes it over (a refusal marks
    it failed with the reason). ``watchdog``: stop this process when the run stalls or overruns
    its limits (``rl-train`` sets it; see :class:`RunWatchdog`).

    Under ``accelerate launch`` this is the main process's part (rlhf.training.distributed): it alone reads
    the database, holds the lock and records the outcome; it hands the other processes the data
    and settings (``CycleJob``) just before training, or nothing when the run does not start."""
    handoff = distributed.Handoff()
    try:
        return _run_training(trigger, algorithm, min_feedback, max_steps, lora, bars, run_id, watchdog, overrides,
                             handoff)
    except RunRefused as exc:
        if run_id is not None:
            db.session.rollback()
            queued = db.session.get(TrainingRun, run_id)
            if queued is not None and queued.status == "queued":
                queued.status, queued.finished_at = "failed", utcnow()
                queued.error = f"refused to start: {exc}"
                db.session.commit()
        raise
    finally:
        handoff.send(None)  # the other processes exit when nothing was sent


def _run_training(trigger: str, algorithm: str | None, min_feedback: int | None, max_steps: int | None,
                  lora: bool | None, bars: ProgressFn | None, queued_id: int | None, watchdog: bool,
                  overrides: dict[str, Any], handoff: distributed.Handoff) -> dict[str, Any]:
    explicit_algorithm = algorithm
    settings = cycle_settings(algorithm, max_steps, lora, **overrides)
    algorithm = settings.algorithm
    cfg = current_app.config
    min_feedback = int(sized_setting("retrain_min_feedback") if min_feedback is None else min_feedback)
    if min_feedback < 0:
        raise RunRefused(f"invalid setting: --min-feedback must be >= 0 (got {min_feedback})")

    with training_lock(run_id=queued_id):
        recovered = recover_stale_runs(keep=queued_id)
        for stale in recovered:  # their work directories died with them (only runs write them; we hold the lock)
            shutil.rmtree(Path(cfg["INSTANCE_DIR"]) / "runs" / f".tmp-run-{stale}", ignore_errors=True)
        parent = active_version()
        if parent is None or not registry.is_complete(parent.location):
            raise RunRefused("no usable active model version; run `flask --app webapp init-model` first")
        events = feedback_event_count()
        if events < min_feedback:
            raise RunRefused(f"not enough feedback yet: {events} feedback events, need at least {min_feedback}")
        settings, size_notes = _sized_to_parent(settings, parent.location, algorithm=explicit_algorithm, lora=lora)
        algorithm = settings.algorithm
        # the run starts where its data does: feedback that arrives while the data stage runs (a minute on a
        # large model's multi-turn chats) is not in this run, so it must count as new for the next one
        data_read_at = utcnow()
        records = feedback_records()
        try:
            # the data stage, once, before any run exists (NotEnoughData refuses the run): every rater's
            # weight in this cycle (rlhf.trust: caps, agreement, quarantine), each stage sized to the data
            prepared = prepare_cycle(records, settings, known_raters())
        except NotEnoughData as exc:
            raise RunRefused(str(exc)) from None
        settings, bundle = prepared.settings, prepared.bundle
        limits = run_limits(settings, DataSize.of(bundle), parent.location)

        run = db.session.get(TrainingRun, queued_id) if queued_id is not None else None
        if run is None:
            run = TrainingRun(trigger=trigger, algorithm=algorithm)
            db.session.add(run)
        run.status, run.stage, run.progress = "running", "data", 0.0
        run.algorithm = algorithm  # a queued row named the configured one; the parent's size may pick another
        run.pid, run.hostname, run.heartbeat_at = os.getpid(), socket.gethostname(), utcnow()
        run.started_at = data_read_at
        run.feedback_counts = {"events": events, **bundle.counts}
        run.config = {**settings.to_dict(), "limits": limits, "processes": distributed.world_size()}
        db.session.commit()
        trust = bundle.counts.get("trust")
        if trust:  # each rater's latest assessment, for the raters page and the verdicts
            store_assessments(run.id, trust.get("raters") or {})
        run_id, parent_id, parent_name, parent_path = run.id, parent.id, parent.name, parent.location
        run_watchdog = RunWatchdog(current_app._get_current_object(), run_id, limits).start() if watchdog else None
        tracker = RunTracker(run_id, bars, watchdog=run_watchdog)
        if recovered:
            tracker.log(f"recovered stale runs {recovered}: marked failed")
        tracker.log(f"parent {parent_name}; {events} feedback events; algorithm {algorithm}")
        for note in size_notes:
            tracker.log(f"sized to the model: {note}")
        if distributed.is_distributed():
            tracker.log(f"training on {distributed.world_size()} processes (data parallel); "
                        "this one (rank 0) records the run and runs the gate")
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
            handoff.send(CycleJob(str(parent_path), str(workdir / "reward"), str(workdir / "policy"), prepared))
            # the data stage's lines (sizing, data, rater trust) are logged as the cycle starts
            result = run_prepared(prepared, parent_path, workdir / "reward", workdir / "policy", progress=tracker,
                                  log=tracker.log, logs=logs)
            reward_path = folder / "reward_model"
            os.rename(workdir / "reward", reward_path)

            status = "candidate" if result.passed else "failed"
            metrics = {"reward_model": result.reward, "policy": result.policy, "evaluation": result.evaluation,
                       "counts": result.counts, "timings": result.timings, "peak_rss_mb": result.peak_rss_mb,
                       **({"peak_gpu_mb": result.peak_gpu_mb} if result.peak_gpu_mb else {}),
                       "reward_model_path": to_stored(reward_path)}

            def move_policy(tmp: Path) -> dict:
                for item in (workdir / "policy").iterdir():
                    os.rename(item, tmp / item.name)
                return {"evaluation": {k: result.evaluation.get(k) for k in
                                       ("passed", "verdict", "reasons", "judged_by", "heldout", "judge",
                                        "reward_gain", "kl_from_parent", "criteria", "flag_risk")}}

            name, path, _ = registry.write_version(
                cfg["MODEL_STORE"], algorithm, move_policy, name=next_version_name(algorithm),
                lineage={"parent": parent_name, "training_run": run_id, "algorithm": algorithm,
                         "data_counts": result.counts, "config": settings.to_dict(),
                         "reward_model": to_stored(reward_path)})
            created_paths.append(path)
            version = ModelVersion(name=name, path=to_stored(path), parent_id=parent_id, kind=algorithm, status=status,
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
            if run_watchdog:
                run_watchdog.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def summary(run: TrainingRun, version: ModelVersion | None) -> dict[str, Any]:
    """The `rl-train --json` object (docs/cli.md)."""
    m = run.metrics or {}
    ev = m.get("evaluation", {})
    return {
        "run_id": run.id, "status": run.status, "algorithm": run.algorithm, "trigger": run.trigger,
        "processes": (run.config or {}).get("processes", 1),
        "data_counts": run.feedback_counts,
        "reward_model": {k: m.get("reward_model", {}).get(k) for k in
                         ("heldout_accuracy", "train_accuracy", "train_pairs", "eval_pairs", "steps", "train_loss",
                          "criteria")}
        | {"path": str(resolve(m["reward_model_path"])) if m.get("reward_model_path") else None}
        | {k: v for k, v in m.get("reward_model", {}).items() if k == "processes"},  # each process's part, if several
        "policy": m.get("policy"),
        "evaluation": gate_summary(ev),
        "version": ({"id": version.id, "name": version.name, "status": version.status, "path": version.location,
                     "parent": version.parent.name if version.parent else None} if version else None),
        "decision": m.get("decision"),
        "timings_s": m.get("timings"),
        "peak_rss_mb": m.get("peak_rss_mb"),
        "peak_gpu_mb": m.get("peak_gpu_mb"),
        "error": run.error,
    }


def gate_summary(ev: dict[str, Any]) -> dict[str, Any]:
    """The evaluation gate's part of the summary: the verdict, the evidence that judged (held-out
    preference pairs, the judge reward model) and, labelled as such, the gain on the reward model
    the policy was optimized against, which never decides."""
    return {"passed": ev.get("passed"), "verdict": ev.get("verdict"), "reasons": ev.get("reasons"),
            "judged_by": ev.get("judged_by"), "heldout": ev.get("heldout"), "judge": ev.get("judge"),
            "evidence_p": ev.get("evidence_p"),
            "optimized_against": {"reward_gain": ev.get("reward_gain"), "decides": False},
            "kl_from_parent": ev.get("kl_from_parent"), "before": ev.get("parent"), "after": ev.get("candidate"),
            "prompts": ev.get("prompts"), "criteria": ev.get("criteria"), "flag_risk": ev.get("flag_risk")}


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)
