"""Training settings picked by the size of the model being trained.

The defaults in rlhf.settings were tuned on the embedded 1 M-parameter model, where training every
weight for a few dozen steps is cheap and right. On a pretrained 100 M+ model they are neither: every
weight of SmolLM2-135M-Instruct's reward model trained for 26 minutes on 2 cores and ranked 0.42 of its
held-out pairs right, and PPO at the defaults took 17.2 GB and over 6 minutes a batch. A model of at
least :data:`LARGE_PARAMETERS` parameters therefore gets the settings of :data:`LARGE` instead of the
defaults, for every setting the operator did not set (benchmarks/RESULTS.md, "A real chat model's
reward stage" and "A real chat model's cycle", has the measurements behind each value).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable

from rlhf.models.adapters import base_of, is_adapter
from rlhf.settings import CycleSettings

# the embedded model has about 1 M parameters, SmolLM2-135M-Instruct 134.5 M: anything from here up is "large"
LARGE_PARAMETERS = 50_000_000

# dotted setting -> value for large models (the reason is in benchmarks/RESULTS.md)
LARGE: dict[str, Any] = {
    # the top 2 of SmolLM2's 30 blocks: at 3e-4 for 60 steps held-out 1.00, AUC 0.97 on answers no one rated,
    # 275 s (at 1e-4 the same took 120 steps, 487 s); the head alone 0.58-0.70 however long, every weight
    # 0.42 in 26 min
    "reward.trainable_layers": 2,
    "reward.learning_rate": 3e-4,
    "reward.min_steps": 60,
    # the judge trains on the held-out rows alone (a few dozen): 60 steps would be 20 epochs of them
    "evaluation.judge_min_steps": 20,
    # ...and only when they ask 5 questions or more: on the deployment shape (16 questions, 3 held out) its 20
    # steps reached 0.58, never trusted, in 156 s, and asking the 3 held-out questions again for it took the
    # gate's sampling from 16 prompts to 31. Skipping both cut a cycle from 1,071 s to 971 s
    "evaluation.judge_min_questions": 5,
    # iterative DPO on LoRA: the parent samples 6 answers per training prompt, the reward model ranks them, DPO
    # trains on best over worst. On SmolLM2 it moved the taste 0.31 -> 0.52 in 441 s; PPO at a budget that
    # fits (48 episodes of LoRA policy and critic, 317 s) moved it 0.31 -> 0.33 (benchmarks/RESULTS.md)
    "algorithm": "iterative_dpo",
    "policy.lora": True,
    # 2 passes over the best-over-worst pairs: at most 16 prompts give about 30 pairs, so at most 8 DPO steps
    # (on 3-turn prompts cut to 384 tokens, 8 steps took about 90 s of a 576-s policy stage, the sampling most of
    # the rest). 4 passes at 2e-4 made 16 steps and a 26-minute
    # cycle; 2 passes at 2e-4 moved a first cycle's policy 15.6 % -> 43.8 % by ground truth but only 1.7 nats on
    # 19 held-out pairs, too little for the gate. 2 passes at twice the rate keep the update's size (5e-4 at 4
    # passes went too far: KL 23, 2 of 14 factual answers lost) (benchmarks/RESULTS.md)
    "policy.learning_rate": 4e-4,
    "policy.epochs": 2.0,
    # ...and at least 8 steps, whatever the pairs: the pairs are those whose sampled answers the reward model set
    # apart, 25 in one loop (8 steps: KL 2.76, thumbs up 32 % -> 46 % in the A/B) and 13 in the next (4 steps:
    # KL 0.41, thumbs up 36 % -> 35 % at 160 users per arm, no verdict) (benchmarks/RESULTS.md)
    "policy.min_steps": 8,
    "policy.batch_size": 8,
    # ...in forward passes of 2 rows: the same update; 8 rows of 384 tokens at once peaked at 17.2 GB
    "policy.micro_batch_size": 2,
    "policy.samples_per_prompt": 6,
    # ...to at most 16 prompts: the measured cycle had 13 (one question per chat); multi-turn chats make a prompt
    # of every rated turn (91 from 150 events), which would multiply the sampling and DPO's steps by 7
    "policy.max_prompts": 16,
    "policy.response_length": 128,
    # a policy trains on the last 384 tokens of prompt + answer: the 256 the reward model reads (reward.max_length)
    # and its 128-token answer. Whole multi-turn histories ran DPO at batch 8 out of 24 GB
    "policy.max_length": 384,
    # PPO, when the operator picks it: LoRA policy and critic on few, short rollouts (a batch about 50 s)
    "policy.mini_batches": 2,
    "policy.ppo_epochs": 2,
    "policy.episodes": 48,
    # a pretrained model's answers outgrow any affordable rollout length (SmolLM2 ends on its own within
    # 256 tokens 11 % of the time): a penalty for not ending would teach brevity, whatever the users like
    "policy.missing_eos_penalty": 0.0,
    "evaluation.max_new_tokens": 128,
    "evaluation.max_prompts": 16,
    # one answer per held-out prompt: with no judge (above) the samples serve only the KL, degeneration and
    # reported reward checks; on SmolLM2's 3-turn chats the gate took 183-193 s instead of 256 (benchmarks/RESULTS.md)
    "evaluation.samples_per_prompt": 1,
    # the held-out pairs' margins are 4 forward passes of up to policy.max_length tokens each: 3-turn chats at
    # 300 events gave 107 pairs and 354 s at whole length; 48 bound the gate's share of a cycle
    "evaluation.max_pairs": 48,
}

# the server's settings (webapp.core.settings names) for a large active model, unless the operator set them
LARGE_DEPLOYMENT: dict[str, Any] = {
    # a cycle on a large model is minutes of large matrix products: every core (0: torch's default). The
    # default of 1 keeps a short run on the embedded model from slowing the web server's answers
    "train_threads": 0,
    # a cycle takes about 14 minutes of the machine, and 150 events is the fewest it was measured to move the
    # policy with: retraining every 50 would keep the machine training on too little
    "retrain_min_feedback": 150,
}


def parameter_count(model_dir: str | Path) -> int | None:
    """The parameters stored in a model folder, from its safetensors headers (no weights are read;
    an adapter folder counts its base's), or None when the folder has no safetensors file."""
    folder = Path(model_dir)
    if is_adapter(folder):
        base = base_of(folder)
        return parameter_count(base) if base.is_dir() and not is_adapter(base) else None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        with path.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                count = 1
                for dim in info["shape"]:
                    count *= dim
                total += count
    return total


def is_large(parameters: int | None) -> bool:
    """Whether a model of ``parameters`` parameters (None: unknown) gets the large-model settings."""
    return parameters is not None and parameters >= LARGE_PARAMETERS


def with_setting(settings: Any, dotted: str, value: Any) -> Any:
    """``settings`` (a dataclass of dataclasses) with the setting ``dotted`` (``reward.learning_rate``) set."""
    head, _, rest = dotted.partition(".")
    inner = getattr(settings, head)
    return dataclasses.replace(settings, **{head: with_setting(inner, rest, value) if rest else value})


def _get(settings: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        settings = getattr(settings, part)
    return settings


def sized_to_model(settings: CycleSettings, parameters: int | None,
                   explicit: Iterable[str] = ()) -> tuple[CycleSettings, list[str]]:
    """``settings`` with :data:`LARGE`'s values for a model of at least :data:`LARGE_PARAMETERS`
    parameters, except the settings in ``explicit`` (dotted names, e.g. ``reward.learning_rate``: what
    the operator set), and a note saying what changed. A smaller or unknown model keeps ``settings``."""
    if not is_large(parameters):
        return settings, []
    kept = set(explicit)
    changed = []
    for name, value in LARGE.items():
        if name in kept or _get(settings, name) == value:
            continue
        settings = with_setting(settings, name, value)
        changed.append(f"{name}={value}")
    if not changed:
        return settings, []
    return settings, [f"a model of {parameters / 1e6:.1f} M parameters trains with the large-model settings: "
                      + ", ".join(changed)]
