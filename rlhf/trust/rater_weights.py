"""Each rater's weight: ``cap x reliability x new``, then the share cap.

The volume cap (rlhf.trust.crowd) and the new-identity factor act on everyone an admin left on
"auto"; the reliability factor comes from the candidate judgement kept (none: 1). An admin's
"quarantined" and a quarantined rater weigh 0; an admin's "trusted" keeps only its cap. Last,
water-filling cuts the heaviest raters so that none makes more than ``max_share`` of the signal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from rlhf.settings import TrustSettings
from rlhf.trust.crowd import Crowd
from rlhf.trust.judgement import RaterJudgement


def rater_weights(crowd: Crowd, candidate: RaterJudgement | None, soft: bool = False) -> dict[int, float]:
    """Each rater's weight before the share cap, under ``candidate``'s judgement (None: no
    reliability factor, nobody quarantined but by an admin); ``soft`` uses its unconditional
    log-odds factor (what the Dawid-Skene iterations weigh by) in place of the applied one."""
    out = {}
    for r in crowd.mass:
        if crowd.admin[r] == "quarantined" or (candidate is not None and r in candidate.quarantined):
            out[r] = 0.0
        elif crowd.admin[r] == "trusted":
            out[r] = crowd.volume_cap[r]
        elif candidate is None:
            out[r] = crowd.volume_cap[r] * crowd.factor_new[r]
        else:
            out[r] = crowd.volume_cap[r] * (candidate.soft if soft else candidate.reliability)[r] * \
                (1.0 if r in candidate.graduated else crowd.factor_new[r])
    return out


@dataclass
class FinalWeights:
    """The weights a cycle trains with, and how they came about."""

    base: dict[int, float]  # before the share cap
    fill: dict[int, float]  # the share cap's factor (<= 1)
    final: dict[int, float]  # base x fill: what each of the rater's rows is multiplied by
    cap: dict[int, float]  # volume cap x share cap: the "capped" rule's factor
    kept: float  # rows' worth of signal the final weights keep
    note: str | None  # what the share cap did, None when it cut nobody


def final_weights(crowd: Crowd, candidate: RaterJudgement | None, settings: TrustSettings) -> FinalWeights:
    """The kept ``candidate``'s weights with the share cap on top."""
    mass = crowd.mass
    base = rater_weights(crowd, candidate)
    fill = water_fill({r: mass[r] * base[r] for r in mass}, settings.max_share)
    final = {r: base[r] * fill[r] for r in mass}
    note = None
    if any(fill[r] < 1 - 1e-9 for r in mass):
        live = sum(1 for r in mass if base[r] > 0)
        note = (f"share cap: no rater above {settings.max_share:g} of the signal" if
                live * settings.max_share >= 1 - 1e-9 else
                f"share cap: {live} raters are fewer than 1/max_share = {1 / settings.max_share:g}: every "
                f"rater counts the same")
    return FinalWeights(base=base, fill=fill, final=final, cap={r: crowd.volume_cap[r] * fill[r] for r in mass},
                        kept=sum(mass[r] * final[r] for r in mass), note=note)


def water_fill(mass: Mapping[int, float], max_share: float) -> dict[int, float]:
    """Factor per rater (<= 1) so that no rater's share of ``sum(mass * factor)`` exceeds
    ``max_share``: the heaviest are cut to a common level, the rest keep all. With fewer raters
    than ``1 / max_share`` (no level works) every rater is cut to the lightest one's mass: all
    count the same."""
    live = {r: m for r, m in mass.items() if m > 0}
    out = {r: 1.0 for r in mass}
    if not live:
        return out
    if len(live) * max_share < 1 - 1e-9:
        level = min(live.values())
        return {**out, **{r: level / m for r, m in live.items()}}
    ordered = sorted(live.values(), reverse=True)
    total = sum(ordered)
    rest = total
    level = math.inf
    for j in range(len(ordered) + 1):  # cap the j heaviest at ``level``
        if j:
            rest -= ordered[j - 1]
        if 1 - j * max_share <= 1e-12:
            level = ordered[-1]
            break
        candidate = max_share * rest / (1 - j * max_share)
        if (j == 0 or ordered[j - 1] >= candidate) and (j == len(ordered) or ordered[j] <= candidate):
            level = candidate
            break
    return {**out, **{r: min(1.0, level / m) for r, m in live.items()}}
