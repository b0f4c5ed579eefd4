"""Two camps: the raters split by a two-camp mixture, and the majority camp's agreement.

Contrary raters are not noise but a camp, and a busy camp with more evidence per person can pull
a fit on everyone to chance or to its side. A mixture of two agreement models (EM) finds the
camps, each with its own share of thumbs up; cross-fitted over folds of raters, each rater is
judged by the model of the camp more *people* are in, fitted without it (selection-free).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from rlhf.settings import TrustSettings
from rlhf.trust.agreement import Tally, dispersion, fold_of, pooled, rater_loglik, score_fold
from rlhf.trust.crowd import Crowd
from rlhf.trust.judgement import RaterJudgement, update_judgement
from rlhf.trust.proxy_model import Items, fit, logit, sigmoid


def camp_weight(items: Items, pi: Mapping[int, float], vote: Mapping[int, float], camp: int) -> np.ndarray:
    """Per item: its raters' mean membership of ``camp`` (0: A, with probability ``pi``; 1: B)
    times their vote; an item without raters 1."""
    return np.array([np.mean([(pi.get(r, 0.5) if camp == 0 else 1 - pi.get(r, 0.5)) * vote.get(r, 1.0)
                              for r in rs]) if rs else 1.0 for rs in items.raters])


def camp_fit(items: Items, use: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A camp's agreement model, fitted on the ``use`` items it weighs (``w``); all zeros with
    fewer than 2 of them."""
    use = use & (w > 1e-9)
    return fit(items.rows[use], items.label[use], w[use], items.bias) if use.sum() >= 2 \
        else np.zeros(items.rows.shape[1])


def camp_prior(pi: Mapping[int, float]) -> float:
    """Camp A's share of the raters, kept off 0 and 1."""
    return min(max(float(np.mean(list(pi.values()))) if pi else 0.5, 1e-3), 1 - 1e-3)


def membership(prior: float, log_ratio: float) -> float:
    """A rater's probability of camp A: the prior's log-odds plus its own items' log-likelihood
    ratio of A's model over B's."""
    return float(sigmoid(np.array([logit(prior) + log_ratio]))[0])


def two_camps(items: Items, train: np.ndarray, vote: Mapping[int, float], folds: int, rounds: int = 6
              ) -> tuple[np.ndarray, np.ndarray, dict[int, float]]:
    """A mixture of two agreement models over the raters of the ``train`` items (EM: each rater is
    in camp A with probability pi; each camp's model is fitted on its raters' items weighted by
    pi and their vote; pi follows the likelihood of the rater's own items). Started by splitting
    raters at the median share of thumbs up, the most visible difference between people who want
    opposite things. Returns camp A's model, camp B's, and each rater's probability of A."""
    single = train & items.single()
    raters = sorted({r for i in np.flatnonzero(train) for r in items.raters[i]})
    up: dict[int, list[float]] = {r: [1.0, 2.0] for r in raters}  # Laplace: (ups + 1) / (rows + 2)
    for i in np.flatnonzero(single & (items.is_kto == 1)):
        r = items.raters[i][0]
        up[r][0] += items.label[i] > 0
        up[r][1] += 1
    rate = {r: a / n for r, (a, n) in up.items()}
    median = float(np.median(list(rate.values()))) if rate else 0.5
    pi = {r: 0.9 if rate[r] > median else 0.5 if rate[r] == median else 0.1 for r in raters}

    inner = fold_of(raters, min(folds, len(raters)))
    item_inner = [{inner[r] for r in rs if r in inner} for rs in items.raters]
    for _ in range(rounds):
        w = [camp_weight(items, pi, vote, 0), camp_weight(items, pi, vote, 1)]
        # each rater is placed by models fitted without it (in-sample, a camp keeps whoever it starts with)
        ll: dict[int, np.ndarray] = {}
        for g in range(min(folds, len(raters))):
            out = np.array([g not in fs for fs in item_inner])
            held = single & ~out
            if not held.any():
                continue
            ll.update(rater_loglik(items, [camp_fit(items, train & out, w[camp]) for camp in (0, 1)], held))
        prior = camp_prior(pi)
        for r in raters:
            pi[r] = membership(prior, float(ll[r][0] - ll[r][1]) if r in ll else 0.0)
    thetas = [camp_fit(items, train, camp_weight(items, pi, vote, camp)) for camp in (0, 1)]
    return thetas[0], thetas[1], pi


def camp_agreement(items: Items, vote: Mapping[int, float], counts: Mapping[int, float], folds: int
                   ) -> tuple[Tally, dict[int, float]]:
    """Cross-fitted camps: for each fold of raters, the two-camp mixture is fitted on the items no
    rater of the fold touched, and the fold's raters are scored by the majority camp's model
    (their agreement) and placed by both models (their probability of being in the majority).
    Nothing about a rater enters the model it is judged by, so under feedback the features cannot
    explain this agreement is chance, as for the plain leave-raters-out fit -- but when a
    minority rates the opposite way with more evidence per person (corrections in the opposite
    style, thumbs down on what the majority is content with), the plain fit is pulled to chance
    while the majority camp's model is not."""
    raters = sorted({r for rs in items.raters for r in rs})
    tally = Tally.empty(raters)
    member: dict[int, float] = {r: 1.0 for r in raters}
    k = min(folds, len(raters))
    fold = fold_of(raters, k)
    item_folds = [{fold[r] for r in rs} for rs in items.raters]
    single = items.single()
    for f in range(k):
        train = np.array([f not in fs for fs in item_folds])
        held = single & np.array([f in fs for fs in item_folds])
        if not held.any() or train.sum() < 2:
            continue
        first, second, pi = two_camps(items, train, vote, folds)
        prior = camp_prior(pi)
        ll = rater_loglik(items, [first, second], held)
        placed = {**pi, **{r: membership(prior, float(a - b)) for r, (a, b) in ll.items()}}
        # the majority is counted over every rater, the fold's too (placed by models fitted
        # without them): counted over the other folds only, a fold holding many of the majority
        # left a tie (measured: 10 of 30 honest raters in one fold of 50, 20 contrary elsewhere)
        size = sum(counts.get(r, 1.0) * m for r, m in placed.items())
        flip = size < sum(counts.get(r, 1.0) for r in placed) - size
        major = second if flip else first
        score_fold(items, major, held, tally)
        for r in ll:
            member[r] = 1.0 - placed[r] if flip else placed[r]
    return tally, member


@dataclass
class Camps:
    """The majority camp's judgement and what it rests on."""

    candidate: RaterJudgement  # each rater judged by the majority camp's model fitted without it
    agreement: tuple[float | None, float]  # that model's balanced agreement, pooled by people, and its p-value
    dispersion_p: float  # p-value of "every rater agrees with it at chance"
    note: str


def majority_camp(items: Items, crowd: Crowd, settings: TrustSettings) -> Camps:
    """The cross-fitted camps (:func:`camp_agreement`) as a candidate judgement: the crowd each
    rater is compared with is the majority camp, and a rater placed in the minority starts with
    its probability of the majority as its factor. Valid when the camps are significant: raters
    spread beyond chance around the majority's model, or it agrees with them above chance."""
    # one rater, one vote, and nothing else: with the volume cap on top (as in the runs'
    # fits) a busy camp's own model was too thin to form, and the split came out muddled
    vote = {r: 0.0 if crowd.admin[r] == "quarantined" else crowd.one_vote(r) for r in crowd.mass}
    tally, member = camp_agreement(items, vote, crowd.headcount, settings.folds)
    agreement = pooled(*tally.balanced(), vote)
    spread = dispersion(*tally.balanced())
    note = (f"camps: the majority camp's model (fitted without each fold) agrees with the raters' own items "
            f"{agreement[0] if agreement[0] is not None else 0:.3f} (balanced, by people), spread beyond chance "
            f"p = {spread:.2g}; {sum(1 for r in crowd.auto if member.get(r, 1.0) < 0.5)} raters placed "
            f"in the minority")
    start = {r: member.get(r, 1.0) if crowd.admin[r] == "auto" else 1.0 for r in crowd.mass}
    candidate = RaterJudgement(soft=dict(start), reliability=dict(start))
    # the crowd it compares a rater with is the majority camp (everyone would include the minority)
    update_judgement(candidate, tally, {r: v * member.get(r, 1.0) for r, v in vote.items()}, crowd, settings)
    candidate.valid = candidate.pooled is not None and (
        min(spread, agreement[1] if agreement[0] is not None and agreement[0] > 0.5 else 1.0) < settings.quarantine_p)
    candidate.notes.append(f"from the majority camp: agreement {candidate.pooled or 0:.3f} on "
                           f"{sum(candidate.checked.values())} rater-items; {len(candidate.quarantined)} below chance, "
                           f"{sum(1 for r in crowd.auto if candidate.soft[r] < 0.5)} below half weight")
    return Camps(candidate=candidate, agreement=agreement, dispersion_p=spread, note=note)
