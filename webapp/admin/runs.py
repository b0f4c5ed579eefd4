"""Training runs as the dashboard and the admin API show them."""
from __future__ import annotations

from typing import Any

from webapp.core.display import display_paths, display_text
from webapp.core.extensions import db
from webapp.core.models import TrainingRun, iso
from webapp.training.eta import time_left
from webapp.training.watchdog import run_health


def run_or_404(run_id: int) -> TrainingRun:
    """The training run, or 404 "Training run not found." (API and pages alike)."""
    return db.get_or_404(TrainingRun, run_id, description="Training run not found.")


def run_dict(run: TrainingRun, full: bool = False) -> dict:
    """A run for the dashboard and the API; paths in it are relative to the instance folder."""
    data = {"id": run.id, "trigger": run.trigger, "algorithm": run.algorithm, "status": run.status,
            "stage": run.stage, "progress": run.progress, "error": display_text(run.error),
            "version_id": run.version_id,
            "decision": (run.metrics or {}).get("decision"), "created_at": iso(run.created_at),
            "started_at": iso(run.started_at), "finished_at": iso(run.finished_at),
            "heartbeat_at": iso(run.heartbeat_at), "pid": run.pid}
    if run.status in ("queued", "running"):
        health = run_health(run)
        data["late"] = health["message"] if health["late"] else None  # shown before the watchdog stops it
        data["eta"] = time_left(run)
    if full:
        data.update(feedback_counts=run.feedback_counts, metrics=display_paths(run.metrics),
                    config=display_paths(run.config), log=display_text(run.log),
                    gate=gate_explanation((run.metrics or {}).get("evaluation")))
    return data


def gate_explanation(evaluation: dict[str, Any] | None) -> dict[str, Any] | None:
    """Which evidence carried the gate's verdict, in words an operator reads: what the gate stored
    (rlhf.gate.verdict.decided_by: the instruments, the effect and its bound). A run judged before
    the gate had an effect size stored none; its sentence says so and gives the sign test it was
    judged by. None for a run the gate never saw."""
    if not evaluation:
        return None
    if evaluation.get("decided_by"):
        return {**evaluation["decided_by"], "rule": "effect size"}
    h = evaluation.get("heldout") or {}
    if not h:
        return None
    words = (f"Judged by the rule before the effect size: the held-out pairs' sign test ({h.get('wins')} of "
             f"{h.get('pairs')} pairs the right way, p = {h.get('p_value')}), which counted the direction of "
             f"each margin however small (mean margin {h.get('mean_margin')} nats).")
    return {"by": None, "better": evaluation.get("passed"), "words": words, "rule": "sign test"}
