"""The assessment's report: per rater and per rule."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RaterReport:
    rater: int
    events: int  # rows this rater contributed to (pairs + kto) this cycle
    raw_share: float  # share of the signal before any rule
    share: float  # share after the rules (sum over raters = 1)
    agreement: float | None  # shrunk agreement with a model trained without this rater (None: not estimable)
    checked: int  # items the agreement was measured on
    weight: float  # multiplier applied to each of the rater's rows (0 for quarantined)
    status: str  # "trusted" | "normal" | "new" | "quarantined"
    reasons: tuple[str, ...]


@dataclass
class TrustResult:
    raters: dict[int, RaterReport]
    rules: dict[str, dict[str, float]]  # per rule: {"raters", "rows", "weight_removed", "share_removed"}
    applied: dict[str, bool]  # which rules could run
    notes: list[str] = field(default_factory=list)
    pooled_agreement: float | None = None  # of the last iteration (None: not measured)
    weight_kept: float = 1.0  # share of the raw signal the weights keep

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: raters keyed by str(id), tuples as lists. ``weight_removed`` is in rows' worth
        of signal (a row with two raters is half a row each), ``share_removed`` the same as a share
        of the cycle's raw signal."""
        return {"raters": {str(r): {**asdict(rep), "reasons": list(rep.reasons)} for r, rep in self.raters.items()},
                "rules": {k: dict(v) for k, v in self.rules.items()}, "applied": dict(self.applied),
                "notes": list(self.notes), "pooled_agreement": self.pooled_agreement,
                "weight_kept": self.weight_kept}
