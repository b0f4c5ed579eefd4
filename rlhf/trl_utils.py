"""Small helpers shared by the TRL-based trainers."""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch

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


def drop_printer(trainer: Any) -> None:
    """Trainer logs go into the run's metrics, not to stdout."""
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
