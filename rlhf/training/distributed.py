"""Training on several processes (``accelerate launch --num_processes N``): who this process is,
and the few collective steps the cycle needs around the trainers' own.

The trainers (TRL's, on transformers' Trainer or accelerate's Accelerator) already run data
parallel under a launcher: each process takes its share of every batch and gradients are
all-reduced (DDP). Around them the cycle needs: the main process's job (the data it read, the
settings, where models go) sent to the others, files the main process wrote made visible to
them before they read (barrier), and each process's own numbers gathered for the record.
With one process every helper here is a no-op, so single-process code paths never change.
"""
from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# accelerate config files (package data): multi_cpu.yaml (gloo, tests), multi_gpu.yaml (DDP),
# deepspeed_zero2.yaml / deepspeed_zero3.yaml (DeepSpeed ZeRO stage 2 / 3)
LAUNCH_DIR = Path(__file__).resolve().parent.parent / "launch"


def world_size() -> int:
    """How many processes train together (``WORLD_SIZE``, set by the launcher; 1 without one)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's index among them (0: the main process)."""
    return int(os.environ.get("RANK", "0"))


def is_distributed() -> bool:
    return world_size() > 1


def is_main() -> bool:
    """The main process: the only one that touches the database, the model store and the gate."""
    return rank() == 0


def _ready() -> bool:
    if not is_distributed():
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def zero_stage() -> int | None:
    """The DeepSpeed ZeRO stage ``accelerate launch`` started this process with (None: no DeepSpeed)."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
        return None
    if os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"):
        return int(os.environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"])
    config = Path(os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", ""))
    if config.is_file():
        return int(json.loads(config.read_text()).get("zero_optimization", {}).get("stage", 0))
    return 0


def unsupported() -> str | None:
    """Why this launch cannot train (None: it can). ZeRO-3 shards the weights themselves: the main
    process alone would save a fraction of each model; saving would need every process to gather them."""
    if zero_stage() == 3:
        return ("DeepSpeed ZeRO stage 3 is not supported yet (the main process saves the models alone, and "
                "ZeRO-3 shards their weights); use rlhf/launch/deepspeed_zero2.yaml or multi_gpu.yaml")
    return None


def init(cpu: bool, timeout_seconds: float) -> None:
    """Join the launcher's process group: gloo on CPU, NCCL on GPUs. Through accelerate's
    ``PartialState``, a singleton the trainers' Accelerator then reuses, so the timeout given here
    holds for every collective of the run: a process waiting longer than it for the others fails
    instead of waiting forever."""
    if not is_distributed() or _ready():
        return
    from accelerate import PartialState

    PartialState(cpu=cpu, timeout=timedelta(seconds=timeout_seconds))


def barrier() -> None:
    """Wait until every process gets here."""
    if _ready():
        import torch.distributed as dist

        dist.barrier()


def broadcast(obj: T | None = None) -> T | None:
    """The main process's ``obj`` (pickled), on every process."""
    if not _ready():
        return obj
    import torch.distributed as dist

    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: T) -> list[T]:
    """Every process's ``obj``, in rank order, on every process (``[obj]`` alone)."""
    if not _ready():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def weights_checksum(model: Any) -> float:
    """The sum of every parameter: equal on every process when their gradients were synchronized
    (each process trains on its own share of the data)."""
    return float(sum(p.detach().double().sum().item() for p in model.parameters()))


def rank_metrics(model: Any, steps: int) -> dict[str, Any]:
    """Each process's optimizer steps and trained-weights checksum, gathered (empty with one process)."""
    if not is_distributed():
        return {}
    return {"processes": gather({"rank": rank(), "steps": int(steps), "weights_checksum": weights_checksum(model)})}


class Handoff:
    """The main process's job for the others, sent exactly once: ``send(None)`` (nothing to do,
    e.g. the run was refused) after a real ``send`` does nothing."""

    def __init__(self) -> None:
        self.sent = False

    def send(self, job: Any) -> None:
        if not self.sent:
            self.sent = True
            broadcast(job)


def launch_command(args: list[str], processes: int, config_file: str | Path, python: str) -> list[str]:
    """The command line that runs ``python -m <args...>`` (e.g. ``flask --app webapp rl-train``)
    on ``processes`` processes through ``accelerate launch`` with ``config_file``."""
    return [python, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
            "--num_processes", str(processes), "-m", *args]


def default_config(cpu: bool) -> Path:
    """The bundled accelerate config for plain data-parallel training on CPUs or GPUs."""
    return LAUNCH_DIR / ("multi_cpu.yaml" if cpu else "multi_gpu.yaml")


def finish() -> None:
    """Leave the process group (at the end of a process's part)."""
    if _ready():
        import torch.distributed as dist

        dist.destroy_process_group()
