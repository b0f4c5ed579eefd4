"""Reading a reward model's per-criterion heads (rlhf.criteria). Work in progress: the training side
lands next; until then no reward model has criterion heads and ``CriteriaScorer.load`` is None."""
from __future__ import annotations

from pathlib import Path
from typing import Any


class CriteriaScorer:
    """Scores answers on each named criterion a reward model was trained on (``names``)."""

    names: tuple[str, ...] = ()

    @classmethod
    def load(cls, reward_dir: str | Path, device: Any = "cpu") -> "CriteriaScorer | None":
        """The scorer of ``reward_dir``'s criterion heads; None when it has none."""
        return None

    def score_answers(self, histories: list[list[dict[str, str]]], answers: list[str]) -> dict[str, list[float]]:
        """Each criterion's score of each answer (given the conversation before it)."""
        raise NotImplementedError

    def flag_risk(self, histories: list[list[dict[str, str]]], answers: list[str]) -> list[float]:
        """For each answer, the probability (0..1) that a user would flag it or mark it rude, from the
        safety head calibrated on the training labels."""
        raise NotImplementedError
