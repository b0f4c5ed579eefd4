"""How much each rater's feedback counts in a training cycle, step by step.

:func:`assess_raters` decides a weight per rater, ``cap x reliability x new``;
rlhf.trust.row_weights turns it into a weight per row. Pure: no Flask, no database. The method
and why it is built this way: docs/rater-trust.md.
"""
from __future__ import annotations

from typing import Mapping

from rlhf.data.datasets import DatasetBundle
from rlhf.settings import TrustSettings
from rlhf.trust.camps import majority_camp
from rlhf.trust.crowd import RaterInfo, crowd_of, validated
from rlhf.trust.dawid_skene import dawid_skene, distrusted_start
from rlhf.trust.guard import choose, guard
from rlhf.trust.judgement import RaterJudgement
from rlhf.trust.proxy_model import agreement_items
from rlhf.trust.rater_weights import final_weights
from rlhf.trust.report import TrustResult, report
from rlhf.trust.row_weights import apply_trust


def assess_raters(bundle: DatasetBundle, raters: Mapping[int, RaterInfo] | None,
                  settings: TrustSettings = TrustSettings()) -> TrustResult:
    """Each rater's weight in ``bundle``; ``raters`` is what the web layer knows of them (a rater
    it lacks is on "auto" and not new)."""
    infos = validated(raters)
    # the evidence: every pair and kto row, and who gave it
    items = agreement_items(bundle)
    # before any agreement: volume caps, the admin's settings, new identities
    crowd = crowd_of(items.raters, infos, settings)
    applied = {"caps": True, "new": any(crowd.new.values()), "reliability": False, "quarantine": False}
    notes: list[str] = []
    chosen: RaterJudgement | None = None
    if settings.iterations == 0:
        notes.append("reliability off (iterations = 0): only the caps and the new-identity rule act")
    elif crowd.counted < 2:
        notes.append("reliability not measured: fewer than 2 raters")
    else:
        # Dawid-Skene from everyone; volume decides which camp's fixed point it finds, so a second
        # run starts from the raters the first distrusted
        first = dawid_skene(items, crowd, settings, {r: 1.0 for r in crowd.mass}, "from everyone:")
        runs = [first]
        if (restart := distrusted_start(first, crowd)) is not None:
            runs.append(dawid_skene(items, crowd, settings, restart, "from the distrusted:"))
        # the cross-fitted camps: each rater judged by the majority camp's model fitted without it
        camps = majority_camp(items, crowd, settings)
        notes.append(camps.note)
        notes += [note for candidate in [*runs, camps.candidate] for note in candidate.notes]
        chosen, why = choose(runs, camps, crowd, settings)
        # the guard: does agreement say anything about a rater here at all
        refusal = guard(first, camps, chosen, crowd, settings)
        if refusal is not None:
            notes.append(refusal)
            chosen = None
        elif chosen is not None:
            applied["reliability"] = applied["quarantine"] = True
            notes.append(why)
    # the weights: cap x reliability x new, then the share cap
    weights = final_weights(crowd, chosen, settings)
    if weights.note is not None:
        notes.append(weights.note)
    return report(crowd, chosen, weights, settings, applied, notes)


def trusted_bundle(bundle: DatasetBundle, raters: Mapping[int, RaterInfo] | None,
                   settings: TrustSettings) -> DatasetBundle:
    """``bundle`` weighed by its raters when ``settings.enabled`` (else unchanged)."""
    if not settings.enabled:
        return bundle
    return apply_trust(bundle, assess_raters(bundle, raters, settings))
