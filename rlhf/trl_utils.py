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


def drop_printer(trainer: Any) -> None:
    """Trainer logs go into the run's metrics, not to stdout."""
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
