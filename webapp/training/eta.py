"""How long a running training run has left, in words for the run page.

The running stage's own pace decides its part: the time since it began over the steps it has done,
times the steps it has left (``training_runs.stage_started_at``, ``stage_done``, ``stage_total``,
written by the run's tracker). The stages after it take as long as they took in the latest run of
the same algorithm that finished (its ``metrics["timings"]``); without one, only the running
stage's time is said. A pretrained 100 M-parameter model's cycle takes minutes per stage on two
cores, so "reward 12 of 40 steps" alone does not tell an operator whether to wait or come back.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from rlhf.progress import STAGES
from webapp.core.extensions import db
from webapp.core.models import TrainingRun, utcnow


def duration_words(seconds: float) -> str:
    """``under a minute``, ``about 7 min``, ``about 1 h 25 min``."""
    if seconds < 60:
        return "under a minute"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60} min" if minutes % 60 else f"about {minutes // 60} h"


def previous_timings(run: TrainingRun) -> tuple[int, dict[str, float]] | None:
    """(run id, stage seconds) of the latest earlier run of the same algorithm that finished with
    its stages timed, or None."""
    rows = db.session.scalars(db.select(TrainingRun).where(
        TrainingRun.status == "succeeded", TrainingRun.algorithm == run.algorithm, TrainingRun.id < run.id)
        .order_by(TrainingRun.id.desc()).limit(20)).all()
    for row in rows:
        timings = (row.metrics or {}).get("timings")
        if isinstance(timings, dict) and timings:
            return row.id, {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))}
    return None


def time_left(run: TrainingRun, now: datetime | None = None,
              earlier: tuple[int, dict[str, float]] | None = None) -> dict[str, Any] | None:
    """The running stage's seconds left, the whole run's (when an earlier run timed the later
    stages) and a sentence saying both, for a running run; None otherwise. ``earlier``: what
    :func:`previous_timings` returns (looked up when not given)."""
    if run.status != "running" or not run.stage or run.stage_started_at is None:
        return None
    now = now or utcnow()
    done, total = run.stage_done or 0, run.stage_total or 0
    if done <= 0 or total <= 0:
        return {"stage_seconds": None, "run_seconds": None, "based_on_run": None,
                "text": f"{run.stage}: timing its first step"}
    elapsed = max(0.0, (now - run.stage_started_at).total_seconds())
    stage_left = elapsed / done * max(0, total - done)
    earlier = previous_timings(run) if earlier is None else earlier
    later = STAGES[STAGES.index(run.stage) + 1:] if run.stage in STAGES else []
    run_left = None
    if earlier is not None and later:
        run_left = stage_left + sum(earlier[1].get(stage, 0.0) for stage in later)
    text = f"{duration_words(stage_left)} left in {run.stage}"
    if run_left is not None:
        text += f"; {duration_words(run_left)} for the whole run (later stages as long as in run #{earlier[0]})"
    elif not later:
        text += " (the last stage)"
    return {"stage_seconds": round(stage_left, 1), "run_seconds": None if run_left is None else round(run_left, 1),
            "based_on_run": earlier[0] if run_left is not None else None, "text": text}
