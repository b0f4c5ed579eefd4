"""A candidate judgement of the raters, and how an agreement tally becomes one.

A :class:`RaterJudgement` is what one estimate (a Dawid-Skene run, or the majority camp's model)
settled on: each rater's agreement shrunk toward the crowd's, its log-odds reliability factor,
and who is significantly below chance (quarantined) or, being new, above it (graduated).
:func:`update_judgement` updates one from a tally. (Not the gate's candidate model nor its judge: a
judgement of the raters.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from scipy import stats

from rlhf.settings import TrustSettings
from rlhf.trust.agreement import Tally, pooled
from rlhf.trust.crowd import Crowd
from rlhf.trust.proxy_model import logit


@dataclass
class RaterJudgement:
    """One candidate judgement: the factors it settled on and what they rest on."""

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


def update_judgement(candidate: RaterJudgement, tally: Tally, vote: Mapping[int, float], crowd: Crowd,
          settings: TrustSettings) -> None:
    """Update ``candidate`` from ``tally``: the crowd's agreement (pooled over raters weighted by
    ``vote``) is the reference; each rater's agreement is shrunk toward it (``prior_strength``
    items) and turned into a log-odds factor relative to it (a typical rater ~1, a chance-level
    one 0). Raters an admin set are measured but not judged."""
    correct, checked = tally.plain()
    crowd_agreement, _ = pooled(correct, checked, vote)
    if crowd_agreement is None:
        return
    candidate.pooled = crowd_agreement
    # at or below chance the reference sits just above it: raters on the majority's side keep
    # their weight and the others lose it, so the next fit sides with one camp (which camp is
    # kept is decided by people: rlhf.trust.guard)
    ref = max(crowd_agreement, 0.5 + 1e-3)
    candidate.quarantined, candidate.graduated, candidate.raw = {}, {}, {}
    for r in crowd.mass:
        n, c = checked[r], correct[r]
        candidate.checked[r] = n
        shrunk = (c + settings.prior_strength * ref) / (n + settings.prior_strength) \
            if n + settings.prior_strength > 0 else ref
        candidate.agreement[r] = shrunk if n else None
        if n:
            candidate.raw[r] = c / n
        if crowd.admin[r] != "auto":
            continue
        candidate.soft[r] = min(1.0, max(0.0, logit(shrunk) / logit(ref)))
        # benefit of the doubt: the factor applies only when the rater's own items show, at
        # the trust decisions' level, that it agrees less than the crowd (honest raters'
        # sampling noise then costs them nothing)
        below = n > 0 and float(stats.binom.cdf(c, n, ref)) < settings.quarantine_p
        candidate.reliability[r] = candidate.soft[r] if below else 1.0
        if n >= settings.min_checked:
            low = float(stats.binom.cdf(c, n, 0.5))
            if low < settings.quarantine_p:
                candidate.quarantined[r] = low
            high = float(stats.binom.sf(c - 1, n, 0.5))
            if crowd.new[r] and high < settings.quarantine_p:
                candidate.graduated[r] = high
