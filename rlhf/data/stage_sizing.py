"""Every training stage sized from the data it has, or refused before training, in one place.

TRL's trainers have hard requirements on their data that the configured batch sizes can break
on a small or odd feedback set. The worst: PPO's dataloader drops incomplete batches and its
``repeat_generator`` loops ``while True: yield from dataloader``, so fewer training prompts
than the batch size spin forever without a single step. Each stage therefore gets batch
sizes no larger than its data, rounded to what the trainer needs (PPO: a multiple of its
mini-batch count; RLOO: whole groups of generations per prompt; KTO: at least 2 rows, since
its KL term pairs rows within a batch), and a data set below a stage's minimum is refused
with a one-line reason that names the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rlhf.settings import PolicySettings, RewardSettings


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


def _round_down(n: int, multiple: int) -> int:
    return n - n % multiple


def size_stages(algorithm: str, reward: RewardSettings, policy: PolicySettings, size: DataSize,
                min_pairs: int, min_prompts: int, processes: int = 1
                ) -> tuple[RewardSettings, PolicySettings, list[str]]:
    """The reward and policy settings fitted to ``size`` and the notes saying what was changed.
    Raises NotEnoughData (one line, with the numbers) when a stage cannot train on it.
    ``processes``: how many train together (rlhf.training.distributed); batch sizes are per process, and
    PPO's rollout batch must fill from each process's share of the prompts."""
    notes: list[str] = []
    # DPO trains on pairs that answer one prompt; a reward model (PPO, RLOO, iterative DPO, the gate's
    # judge) also on rated pairs across prompts, so a thumb on any turn of anyone's chat counts there
    pairs = size.train_pairs if algorithm == "dpo" else size.train_pairs + size.rated_train
    if pairs < min_pairs:
        kinds = ("corrections, compare votes, or differing ratings on answers to the same question" if algorithm == "dpo"
                 else "corrections, compare votes, and liked answers over disliked ones, each rated answer on any "
                      "turn joining a few")
        raise NotEnoughData(f"not enough feedback yet: {pairs} preference pairs for training, "
                            f"need at least {min_pairs} ({kinds})")
    if size.distinct_prompts < min_prompts:
        raise NotEnoughData(f"not enough feedback yet: {size.distinct_prompts} distinct user prompts, "
                            f"need at least {min_prompts}")
    if pairs < reward.batch_size:
        notes.append(f"reward model: batch size {reward.batch_size} -> {pairs} ({pairs} training pairs)")
        reward = replace(reward, batch_size=pairs)

    if algorithm == "ppo":
        # the rollout batch must fill (drop_last) and split into equal mini-batches
        need = policy.mini_batches * processes
        if size.policy_prompts < need:
            raise NotEnoughData(f"not enough feedback yet: {size.policy_prompts} training prompts, PPO needs at "
                                f"least {need} (one per mini-batch" + (f" on each of {processes} processes"
                                                                      if processes > 1 else "")
                                + ") to fill a rollout batch")
        share = size.policy_prompts // processes
        batch = _round_down(min(policy.batch_size, share), policy.mini_batches)
        if batch != policy.batch_size:
            notes.append(f"PPO: batch size {policy.batch_size} -> {batch} ({size.policy_prompts} training prompts, "
                         + (f"{share} per process, " if processes > 1 else "")
                         + f"{policy.mini_batches} mini-batches)")
            policy = replace(policy, batch_size=batch, episodes=max(policy.episodes, batch))
    elif algorithm == "rloo":
        groups = max(1, policy.batch_size // policy.rloo_generations)  # distinct prompts per batch
        if size.policy_prompts < 1:
            raise NotEnoughData("not enough feedback yet: 0 training prompts, RLOO needs at least 1")
        if size.policy_prompts < groups or policy.batch_size % policy.rloo_generations:
            fitted = min(groups, size.policy_prompts) * policy.rloo_generations
            notes.append(f"RLOO: batch size {policy.batch_size} -> {fitted} ({size.policy_prompts} training prompts x "
                         f"{policy.rloo_generations} generations)")
            policy = replace(policy, batch_size=fitted, mini_batches=1, episodes=max(policy.episodes, fitted))
    elif algorithm == "iterative_dpo":
        if size.policy_prompts < 1:
            raise NotEnoughData("not enough feedback yet: 0 training prompts, iterative DPO needs at least 1")
    elif algorithm == "dpo":
        if size.train_pairs < policy.batch_size:
            notes.append(f"DPO: batch size {policy.batch_size} -> {size.train_pairs} ({size.train_pairs} pairs)")
            policy = replace(policy, batch_size=size.train_pairs, mini_batches=1)
    elif algorithm == "kto":
        if not size.kto_good or not size.kto_bad:
            raise NotEnoughData(f"not enough feedback yet: KTO needs both good and bad rated answers "
                                f"(have {size.kto_good} good, {size.kto_bad} bad)")
        rows = size.kto_good + size.kto_bad
        if rows < 2:  # unreachable with one of each, kept as the trainer's own rule
            raise NotEnoughData(f"not enough feedback yet: {rows} rated answers, KTO needs at least 2")
        if rows < policy.batch_size:
            notes.append(f"KTO: batch size {policy.batch_size} -> {rows} ({rows} rated answers)")
            policy = replace(policy, batch_size=rows, mini_batches=1)
    return reward, policy, notes
