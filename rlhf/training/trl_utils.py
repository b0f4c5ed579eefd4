"""Small helpers shared by the TRL-based trainers."""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Callable

import torch
from transformers import TrainerCallback

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def training_precision(device: torch.device) -> dict[str, Any]:
    """bf16 only where the hardware supports it (CUDA with bf16); fp32 everywhere else."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return {"bf16": True}
    return {"bf16": False, "fp16": False}


def quiet_trl() -> None:
    """Silence warnings that say nothing actionable for this app's small models."""
    warnings.filterwarnings("ignore", message=".*experimental.*")
    warnings.filterwarnings("ignore", message=".*loss_type=None.*")
    logging.getLogger("transformers.modeling_utils").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


class ProgressCallback(TrainerCallback):
    """Reports a Trainer's steps as ``progress(stage, step, max_steps)``."""

    def __init__(self, progress: Callable[[str, int, int], None] | None, stage: str) -> None:
        self.progress, self.stage = progress, stage

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress:
            self.progress(self.stage, state.global_step, max(state.max_steps, 1))


class CurvesCallback(TrainerCallback):
    """Hands every Trainer log (``on_log``) to ``metrics(stage, trainer, step, logs)``."""

    def __init__(self, metrics: Callable[[str, str, int, dict], None], stage: str, trainer: str) -> None:
        self.metrics, self.stage, self.trainer = metrics, stage, trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.metrics(self.stage, self.trainer, state.global_step, dict(logs))


def report_to(logs: Any) -> list[str]:
    """``report_to`` of a trainer's config: TensorBoard when ``logs`` (rlhf.training.curves.TrainingLogs)
    asks for it."""
    return ["tensorboard"] if logs is not None and logs.tensorboard_dir else []


def attach_logs(trainer: Any, logs: Any, stage: str, name: str) -> None:
    """Send ``trainer``'s per-step logs where ``logs`` (rlhf.training.curves.TrainingLogs) says: the curves
    callback, and TensorBoard event files under ``tensorboard_dir/<stage>`` (transformers 5 has
    no ``logging_dir`` argument: its TensorBoard callback is pointed there before training)."""
    if logs is None:
        return
    if logs.metrics is not None:
        trainer.add_callback(CurvesCallback(logs.metrics, stage, name))
    if logs.tensorboard_dir:
        from transformers.integrations import TensorBoardCallback

        for cb in trainer.callback_handler.callbacks:
            if isinstance(cb, TensorBoardCallback):
                cb.logging_dir = os.path.join(logs.tensorboard_dir, stage)


def drop_printer(trainer: Any) -> None:
    """Trainer logs go into the run's metrics, not to stdout."""
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
