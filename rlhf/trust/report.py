"""The assessment's report: each rater's weight with its status and reasons, and per rule how
many raters and rows it touched and how much signal it removed (the run's ``counts["trust"]``,
shown on the admin's pages).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rlhf.settings import TrustSettings
from rlhf.trust.crowd import Crowd
from rlhf.trust.judgement import RaterJudgement
from rlhf.trust.rater_weights import FinalWeights
from rlhf.trust.vocabulary import RULES


@dataclass(frozen=True)
class RaterReport:
    """One rater's assessment."""

    rater: int
    events: int  # rows this rater contributed to (pairs + kto) this cycle
    raw_share: float  # share of the signal before any rule
    share: float  # share after the rules (sum over raters = 1)
    agreement: float | None  # shrunk agreement with a model trained without this rater (None: not estimable)
    checked: int  # items the agreement was measured on
    weight: float  # multiplier applied to each of the rater's rows (0 for quarantined)
    status: str  # one of RATER_STATUSES: "trusted" | "normal" | "new" | "quarantined"
    reasons: tuple[str, ...]


@dataclass
class TrustResult:
    """The assessment of a cycle's raters."""

    raters: dict[int, RaterReport]
    rules: dict[str, dict[str, float]]  # per rule: {"raters", "rows", "weight_removed", "share_removed"}
    applied: dict[str, bool]  # which rules could run
    notes: list[str] = field(default_factory=list)
    pooled_agreement: float | None = None  # the kept candidate's crowd agreement (None: none kept)
    weight_kept: float = 1.0  # share of the raw signal the weights keep

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: raters keyed by str(id), tuples as lists. ``weight_removed`` is in rows' worth
        of signal (a row with two raters is half a row each), ``share_removed`` the same as a share
        of the cycle's raw signal."""
        return {"raters": {str(r): {**asdict(rep), "reasons": list(rep.reasons)} for r, rep in self.raters.items()},
                "rules": {k: dict(v) for k, v in self.rules.items()}, "applied": dict(self.applied),
                "notes": list(self.notes), "pooled_agreement": self.pooled_agreement,
                "weight_kept": self.weight_kept}


def report(crowd: Crowd, chosen: RaterJudgement | None, weights: FinalWeights, settings: TrustSettings,
           applied: dict[str, bool], notes: list[str]) -> TrustResult:
    """The result: per rater (in id order) its status and the reasons, each rule's share of the
    signal removed counted in the order the rules act (quarantine, caps, reliability, new)."""
    mass, total, admin = crowd.mass, crowd.total, crowd.admin
    quarantined = chosen.quarantined if chosen else {}
    graduated = chosen.graduated if chosen else {}
    reliability = {r: chosen.reliability.get(r, 1.0) for r in mass} if chosen else {r: 1.0 for r in mass}
    agreement = {r: chosen.agreement.get(r) for r in mass} if chosen else {r: None for r in mass}
    checked = {r: chosen.checked.get(r, 0) for r in mass} if chosen else {r: 0 for r in mass}
    final, cap, kept = weights.final, weights.cap, weights.kept
    reports: dict[int, RaterReport] = {}
    rules = {name: {"raters": 0, "rows": 0, "weight_removed": 0.0} for name in RULES}
    for r in sorted(mass):
        reasons: list[str] = []
        removed: list[tuple[str, float]] = []  # (rule, rows' worth of this rater's signal it removed)
        m = mass[r]
        if admin[r] == "quarantined" or r in quarantined:
            status = "quarantined"
            reasons.append("quarantined by an admin" if admin[r] == "quarantined"
                           else f"quarantined: disagrees, p={quarantined[r]:.2g}")
            removed.append(("quarantined", m))
        else:
            status = "trusted" if admin[r] == "trusted" else "normal"
            if admin[r] == "trusted":
                reasons.append("trusted by an admin")
            left = m
            if cap[r] < 1 - 1e-9:
                reasons.append("capped")
                removed.append(("capped", left * (1 - cap[r])))
                left *= cap[r]
            if admin[r] == "auto" and reliability[r] < 1 - 1e-9:
                reasons.append(f"down-weighted: agreement {agreement[r] if agreement[r] is not None else 0:.2f}")
                removed.append(("down_weighted", left * (1 - reliability[r])))
                left *= reliability[r]
            if crowd.new[r] and r in graduated:
                reasons.append(f"graduated: agrees, p={graduated[r]:.2g}")
            elif crowd.new[r]:
                status = "new"
                reasons.append("new identity")
                removed.append(("new", left * (1 - settings.new_weight)))
        for name, amount in removed:
            rules[name]["raters"] += 1
            rules[name]["rows"] += crowd.events[r]
            rules[name]["weight_removed"] += amount
        reports[r] = RaterReport(
            rater=r, events=crowd.events[r], raw_share=round(m / total, 6) if total else 0.0,
            share=round(m * final[r] / kept, 6) if kept > 0 else 0.0,
            agreement=None if agreement[r] is None else round(float(agreement[r]), 4), checked=int(checked[r]),
            weight=round(final[r], 6), status=status, reasons=tuple(reasons))
    for name in RULES:
        rules[name]["weight_removed"] = round(rules[name]["weight_removed"], 4)
        rules[name]["share_removed"] = round(rules[name]["weight_removed"] / total, 4) if total else 0.0
    pooled = chosen.pooled if chosen else None
    return TrustResult(raters=reports, rules=rules, applied=applied, notes=notes,
                       pooled_agreement=None if pooled is None else round(float(pooled), 4),
                       weight_kept=round(kept / total, 4) if total else 1.0)
