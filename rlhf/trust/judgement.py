"""A candidate judgement of the raters: the factors a run settled on and what they rest on."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _State:
    """One Dawid-Skene run: the factors it settled on and what they rest on."""

    soft: dict[int, float]  # the log-odds reliability factor (what the iterations weigh by)
    reliability: dict[int, float] = field(default_factory=dict)  # applied: 1 unless significantly below the crowd
    quarantined: dict[int, float] = field(default_factory=dict)  # rater -> p-value
    graduated: dict[int, float] = field(default_factory=dict)  # rater -> p-value
    agreement: dict[int, float | None] = field(default_factory=dict)  # shrunk
    checked: dict[int, int] = field(default_factory=dict)
    raw: dict[int, float] = field(default_factory=dict)  # unshrunk, raters with items only
    pooled: float | None = None
    first: tuple[float | None, float] = (None, 1.0)  # balanced agreement of the first fit, its p-value
    dispersion_p: float = 1.0  # the first fit: p-value of "every rater agrees at chance" (chi-square)
    valid: bool = False
    support: float = 0.0
    notes: list[str] = field(default_factory=list)
