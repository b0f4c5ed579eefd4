"""Which candidate judgement is kept, and the guard that decides whether agreement counts at all.

The majority camp's judgement is kept when its camps are significant (it is measured without
selection); otherwise the valid Dawid-Skene runs go head to head and the one more people side
with is kept. The guard then asks questions that selection cannot fake; when none says the
features express what raters prefer, reliability and quarantine are not applied.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from rlhf.settings import TrustSettings
from rlhf.trust.camps import Camps
from rlhf.trust.crowd import Crowd
from rlhf.trust.judgement import RaterJudgement


def head_to_head(a: RaterJudgement, b: RaterJudgement, counts: Mapping[int, float]) -> RaterJudgement:
    """The fixed point more people side with: each rater (counted ``counts[r]``: a new identity
    ``new_weight``, as a swarm of fresh accounts agreeing with itself is not a crowd) backs the one
    its own items agree with more (a tie: half each). Absolute counts ("raters above 0.5") failed
    here: a blurred fixed point that half-agrees with everybody tied with the honest one."""
    for st, other in ((a, b), (b, a)):
        st.support = sum(counts.get(r, 0.0) * (1.0 if st.raw[r] > other.raw[r] else 0.5 if st.raw[r] == other.raw[r]
                                               else 0.0) for r in st.raw if r in other.raw)
    return a if a.support >= b.support else b


def choose(runs: Sequence[RaterJudgement], camps: Camps, crowd: Crowd, settings: TrustSettings
           ) -> tuple[RaterJudgement | None, str]:
    """The candidate to keep (None: no run is valid) and a note saying why."""
    if camps.candidate.valid:
        # selection-free (no rater's items choose the model it is judged by), so it is not
        # put head to head with the Dawid-Skene runs, whose agreement is inflated by
        # reweighting on the same items
        return camps.candidate, ("kept the majority camp's agreement: the camps are significant, and it is "
                                 "measured without selection")
    valid = [run for run in runs if run.valid]
    chosen: RaterJudgement | None = None
    for run in valid:
        chosen = run if chosen is None else head_to_head(chosen, run, crowd.headcount)
    if chosen is None:
        return None, ""
    return chosen, (f"kept the run {chosen.notes[0].split(':')[0] if chosen.notes else ''}"
                    + (f": head to head, more raters side with it ({chosen.support:g}, new identities "
                       f"counting {settings.new_weight:g})" if len(valid) > 1 else ": the only valid run"))


def guard(first: RaterJudgement, camps: Camps, chosen: RaterJudgement | None, crowd: Crowd,
          settings: TrustSettings) -> str | None:
    """Why agreement says nothing about a rater here (a note; reliability and quarantine are then
    not applied), or None when it does.

    Later fits are weighted by agreement measured on the same items, so even a preference the
    features cannot express ends up looking learnable (measured on coin-flip judgements: pooled
    agreement 0.55 -> 0.65 in three rounds). So the guard asks what selection cannot fake: does
    the first, unweighted fit (``first``) or the cross-fitted majority camp's model agree with
    held-out raters above chance; do raters spread around chance beyond what chance allows; or
    does some rater disagree with the kept fixed point beyond chance even after a Bonferroni
    correction over all raters."""
    balanced, balanced_p = first.first
    disagrees = chosen is not None and any(p * len(crowd.mass) < settings.quarantine_p
                                           for p in chosen.quarantined.values())
    dispersed = min(first.dispersion_p, camps.dispersion_p) < settings.quarantine_p
    camp, camp_p = camps.agreement
    majority = camp is not None and camp > 0.5 and camp_p < settings.quarantine_p
    if (balanced is not None and balanced > 0.5 and balanced_p < settings.quarantine_p) or disagrees \
            or dispersed or majority:
        return None
    shown = "none" if balanced is None else f"{balanced:.3f} (p = {balanced_p:.2g})"
    return (f"reliability not applied: the leave-raters-out agreement is not significantly above "
            f"chance (balanced {shown}), raters do not spread beyond chance around it (p = "
            f"{min(first.dispersion_p, camps.dispersion_p):.2g}), the majority camp's model does not predict "
            f"held-out raters either, and no rater disagrees beyond chance: the features cannot "
            f"express what raters prefer, so agreement says nothing about a rater")
