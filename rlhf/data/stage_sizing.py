"""What a cycle has to train on (:class:`DataSize`), and the refusal when it is not enough.

TRL's trainers have hard requirements on their data that the configured batch sizes can break
on a small or odd feedback set (the worst: PPO's loader drops incomplete batches and repeats
``while True``, so fewer prompts than a batch spin forever without a step). Each stage is
therefore sized to its data before training, and a data set below a stage's minimum is refused
with a one-line reason that names the numbers: the policy algorithms' own rules live with each
algorithm (rlhf.policy.algorithms, ``size_stages``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class NotEnoughData(ValueError):
    """The feedback does not (yet) support a training cycle; the message says what is missing."""


@dataclass(frozen=True)
class DataSize:
    """What a cycle has to train on (counted from the DatasetBundle)."""

    train_pairs: int
    eval_pairs: int
    rated_train: int  # rated pairs across prompts (liked over disliked answers): the reward model's too
    policy_prompts: int  # PPO/RLOO training prompts (rows; a prompt asked twice counts twice)
    distinct_prompts: int  # distinct user prompts, training and held-out
    kto_good: int
    kto_bad: int

    @classmethod
    def of(cls, bundle: Any) -> "DataSize":
        prompts = policy_prompts(bundle)
        every = [r["prompt"] for split in ("train", "eval") for r in bundle.prompts[split]]
        labels = [r["label"] for r in bundle.kto["train"]]
        return cls(train_pairs=len(bundle.pairs["train"]), eval_pairs=len(bundle.pairs["eval"]),
                   rated_train=sum(r["source"] == "rated" for r in bundle.rated["train"]),
                   policy_prompts=len(prompts), distinct_prompts=len({_key(p) for p in every}),
                   kto_good=sum(1 for x in labels if x), kto_bad=sum(1 for x in labels if not x))


def _key(prompt: Any) -> str:
    return repr(prompt)


def policy_prompts(bundle: Any) -> list:
    """The prompts PPO/RLOO train on: the training split's, or the held-out ones if it has none."""
    return [r["prompt"] for r in bundle.prompts["train"]] or [r["prompt"] for r in bundle.prompts["eval"]]
