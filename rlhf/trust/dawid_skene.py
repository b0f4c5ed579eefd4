"""Dawid-Skene runs: weights -> leave-raters-out fits -> agreement -> weights, iterated.

Each iteration fits the agreement model on every item, each rater voting once (up to the median
volume) times its current weight, scores every rater by the fits that left it out, and judges the
raters again (rlhf.trust.judgement). Raters who contradict each other form camps and each camp is
a fixed point: :func:`distrusted_start` is where a second run starts to find the other one.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from rlhf.settings import TrustSettings
from rlhf.trust.agreement import dispersion, leave_raters_out, pooled
from rlhf.trust.crowd import Crowd
from rlhf.trust.judgement import RaterJudgement, update_judgement
from rlhf.trust.proxy_model import Items
from rlhf.trust.rater_weights import rater_weights


def votes(items: Items, crowd: Crowd, candidate: RaterJudgement) -> tuple[dict[int, float], np.ndarray]:
    """One rater, one vote (up to the median volume) times its current weight; per item the
    mean of its raters' votes (a row without raters: 1)."""
    current = rater_weights(crowd, candidate, soft=True)
    vote = {r: current[r] * crowd.one_vote(r) for r in crowd.mass}
    return vote, np.array([np.mean([vote[r] for r in rs]) if rs else 1.0 for rs in items.raters])


def dawid_skene(items: Items, crowd: Crowd, settings: TrustSettings, start: Mapping[int, float],
                label: str) -> RaterJudgement:
    """A run from the reliability factors ``start``, ``settings.iterations`` times round; valid
    when the crowd's agreement ends above chance. ``label`` starts its notes."""
    single = items.single()
    everything = np.ones(len(items.raters), bool)
    candidate = RaterJudgement(soft=dict(start), reliability=dict(start))
    for it in range(settings.iterations):
        vote, fit_weight = votes(items, crowd, candidate)
        if not fit_weight.any():
            break
        tally = leave_raters_out(items, fit_weight, settings.folds, everything, single)
        if it == 0:
            candidate.first = pooled(*tally.balanced(), vote)
            candidate.dispersion_p = dispersion(*tally.balanced())
        update_judgement(candidate, tally, vote, crowd, settings)
        candidate.notes.append(
            f"{label} iteration {it + 1}: agreement {candidate.pooled if candidate.pooled is not None else 0:.3f} on "
            f"{sum(candidate.checked.values())} rater-items; {len(candidate.quarantined)} below chance, "
            f"{sum(1 for r in crowd.auto if candidate.soft[r] < 0.5)} below half weight")
    candidate.valid = candidate.pooled is not None and candidate.pooled > 0.5
    return candidate


def distrusted_start(first: RaterJudgement, crowd: Crowd) -> dict[int, float] | None:
    """Where a second run starts: from the raters ``first`` distrusted (its factors flipped, its
    quarantined raters at full weight). None when it distrusted nobody (no second run)."""
    flipped = {r: (1.0 if r in first.quarantined else 1.0 - first.soft[r]) if crowd.admin[r] == "auto" else 1.0
               for r in crowd.mass}
    return flipped if any(flipped[r] > 0.5 for r in crowd.auto) else None
