"""KTO on single rated answers, good or bad (TRL's KTOTrainer: rlhf.policy.offline)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlhf.data.stage_sizing import DataSize, NotEnoughData
from rlhf.policy.algorithms.base import Algorithm, Chart, PolicyJob
from rlhf.policy.algorithms.dpo import offline_units
from rlhf.settings import PolicySettings


class KTO(Algorithm):
    name, title = "kto", "KTO"
    charts = (
        Chart("Loss", ("loss",)),
        Chart("Rewards: desirable and undesirable", ("rewards/chosen", "rewards/rejected"),
              ("desirable", "undesirable")),
        Chart("Reward margin", ("rewards/margins",)),
        Chart("KL estimate", ("kl",)),
    )

    def fit(self, policy: PolicySettings, size: DataSize, processes: int = 1) -> tuple[PolicySettings, list[str]]:
        if not size.kto_good or not size.kto_bad:  # its KL term pairs rows within a batch: both kinds, 2 rows
            raise NotEnoughData(f"not enough feedback yet: KTO needs both good and bad rated answers "
                                f"(have {size.kto_good} good, {size.kto_bad} bad)")
        rows = size.kto_good + size.kto_bad
        if rows >= policy.batch_size:
            return policy, []
        return replace(policy, batch_size=rows), [
            f"KTO: batch size {policy.batch_size} -> {rows} ({rows} rated answers)"]

    def work_units(self, policy: PolicySettings, size: DataSize) -> float:
        return offline_units(size.kto_good + size.kto_bad, policy)

    def train(self, job: PolicyJob) -> dict[str, Any]:
        from rlhf.policy.offline import train_kto

        return train_kto(job.parent_dir, job.bundle.kto["train"], job.out_dir, job.settings.policy,
                         job.settings.device, job.progress, job.logs)


ALGORITHM = KTO()
