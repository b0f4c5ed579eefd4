"""Training curves: every trainer's per-step logs as JSON lines, written while training runs.

One object per logged step: ``{"stage": "reward"|"policy", "trainer": "reward"|"ppo"|...,
"step": N, "metrics": {name: number}}``. Each line is flushed (the file is opened, appended and
closed per step), so a reader sees the curves grow while the run trains; a line being written
when it is read is skipped (``read_curves``). Plain paths and numbers: no web code here.
"""
from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MetricsFn = Callable[[str, str, int, dict[str, Any]], None]  # (stage, trainer, step, logs)

# The last log of a Trainer is its summary (runtime, samples per second, mean loss): not a step.
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos")


def numeric_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of one Trainer log (booleans, strings, NaN and infinities left out)."""
    out: dict[str, float] = {}
    for key, value in (logs or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out[str(key)] = value
    return out


class CurvesFile:
    """A ``MetricsFn`` that appends each logged step to ``path`` (JSON lines)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def __call__(self, stage: str, trainer: str, step: int, logs: dict[str, Any]) -> None:
        if any(k in (logs or {}) for k in SUMMARY_KEYS):
            return
        metrics = numeric_metrics(logs)
        if not metrics:
            return
        line = json.dumps({"stage": stage, "trainer": trainer, "step": int(step), "metrics": metrics})
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()


def read_curves(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a curves file (none when it does not exist); a half-written last line is skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("metrics"), dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def series(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, float]]]]:
    """``{stage: {metric: [{"step", "value"}, ...]}}`` from curves rows, in step order."""
    out: dict[str, dict[str, list[dict[str, float]]]] = {}
    for row in rows:
        stage = str(row.get("stage") or "policy")
        for key, value in row["metrics"].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault(stage, {}).setdefault(key, []).append({"step": row["step"], "value": value})
    for metrics in out.values():
        for points in metrics.values():
            points.sort(key=lambda p: p["step"])
    return out


@dataclass(frozen=True)
class TrainingLogs:
    """Where the trainers' logs go besides the run's metrics: ``metrics`` receives every logged
    step (e.g. a ``CurvesFile``); ``tensorboard_dir``: TensorBoard event files, one
    subdirectory per stage (needs the ``tensorboard`` package)."""
    metrics: MetricsFn | None = None
    tensorboard_dir: str | None = None
