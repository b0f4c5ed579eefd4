"""What a policy-training algorithm is: one record per algorithm (its settings' rules, how it is
sized to the data, what a run of it costs, the curves its trainer logs) and the one call the cycle
makes to train with it (:meth:`Algorithm.train` on a :class:`PolicyJob`).

Nothing here loads torch or TRL: each algorithm imports its trainer inside ``train``, so the web
app and the settings can ask an algorithm about itself cheaply.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.data.datasets import DatasetBundle
from rlhf.data.stage_sizing import DataSize, NotEnoughData
from rlhf.progress import ProgressFn
from rlhf.settings import CycleSettings, PolicySettings


@dataclass(frozen=True)
class Chart:
    """One chart of a run's policy curves: TRL's own metric names (trl 1.12) as its trainer logs them.
    ``optional``: drawn only for runs that log its metrics."""

    title: str
    metrics: tuple[str, ...]
    labels: tuple[str, ...] = ()
    percent: bool = False
    optional: bool = False


@dataclass(frozen=True)
class PolicyJob:
    """Everything a policy trainer gets, the same for every algorithm: the parent model, the run's
    reward model, the data stage's datasets and the training prompts, the sized settings, and where
    the new policy, progress and per-step logs go."""

    parent_dir: str | Path
    reward_dir: str | Path
    out_dir: str | Path
    bundle: DatasetBundle
    prompts: list[list[dict]]
    settings: CycleSettings
    progress: ProgressFn | None = None
    logs: Any = None


class Algorithm:
    """The defaults describe an algorithm that trains on the training prompts against the reward
    model (PPO, RLOO, iterative DPO); subclasses override what differs."""

    name: str = ""
    title: str = ""
    # what makes the preference pairs it needs (the refusal names them when there are too few)
    pairs_from: str = ("corrections, compare votes, and liked answers over disliked ones, each rated answer on any "
                       "turn joining a few")
    charts: tuple[Chart, ...] = ()

    def check(self, policy: PolicySettings) -> None:
        """Raise ValueError when ``policy`` breaks one of this algorithm's own rules (beyond the
        ranges every field checks)."""

    def training_pairs(self, size: DataSize) -> int:
        """The preference pairs that count toward the cycle's minimum: the reward model's, which also
        learns from rated pairs across questions."""
        return size.train_pairs + size.rated_train

    def fit(self, policy: PolicySettings, size: DataSize, processes: int = 1) -> tuple[PolicySettings, list[str]]:
        """``policy`` fitted to ``size`` (batch sizes no larger than the data, rounded to what the
        trainer needs) and notes saying what changed; NotEnoughData when it cannot train on it."""
        return policy, []

    def work_units(self, policy: PolicySettings, size: DataSize) -> float:
        """Roughly how much work the policy stage is (a rollout, or a row per epoch), for the
        watchdog's time limit."""
        return float(min(policy.episodes, policy.max_steps * policy.batch_size) if policy.max_steps
                     else policy.episodes)

    def train(self, job: PolicyJob) -> dict[str, Any]:
        """Train the policy; its metrics (``algorithm`` and the trainer's summary)."""
        raise NotImplementedError

    @staticmethod
    def need_prompts(size: DataSize, title: str) -> None:
        if size.policy_prompts < 1:
            raise NotEnoughData(f"not enough feedback yet: 0 training prompts, {title} needs at least 1")
