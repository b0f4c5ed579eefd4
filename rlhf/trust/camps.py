"""Two camps: a cross-fitted two-camp mixture of agreement models."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from rlhf.trust.agreement import _fold_of, _rater_loglik, _score_fold, _Tally
from rlhf.trust.proxy_model import _fit, _Items, _logit, _sigmoid


def _two_camps(items: _Items, train: np.ndarray, vote: Mapping[int, float], folds: int, rounds: int = 6
               ) -> tuple[np.ndarray, np.ndarray, dict[int, float]]:
    """A mixture of two agreement models over the raters of the ``train`` items (EM: each rater is
    in camp A with probability pi; each camp's model is fitted on its raters' items weighted by
    pi and their vote; pi follows the likelihood of the rater's own items). Started by splitting
    raters at the median share of thumbs up, the most visible difference between people who want
    opposite things. Returns camp A's model, camp B's, and each rater's probability of A."""
    single = train & np.array([len(rs) == 1 for rs in items.raters])
    raters = sorted({r for i in np.flatnonzero(train) for r in items.raters[i]})
    up: dict[int, list[float]] = {r: [1.0, 2.0] for r in raters}  # Laplace: (ups + 1) / (rows + 2)
    for i in np.flatnonzero(single & (items.is_kto == 1)):
        r = items.raters[i][0]
        up[r][0] += items.label[i] > 0
        up[r][1] += 1
    rate = {r: a / n for r, (a, n) in up.items()}
    median = float(np.median(list(rate.values()))) if rate else 0.5
    pi = {r: 0.9 if rate[r] > median else 0.5 if rate[r] == median else 0.1 for r in raters}

    def camp_weight(camp: int) -> np.ndarray:
        """Per item: its raters' mean membership of ``camp`` times their vote."""
        return np.array([np.mean([(pi.get(r, 0.5) if camp == 0 else 1 - pi.get(r, 0.5)) * vote.get(r, 1.0)
                                  for r in rs]) if rs else 1.0 for rs in items.raters])

    def camp_fit(use: np.ndarray, w: np.ndarray) -> np.ndarray:
        use = use & (w > 1e-9)
        return _fit(items.rows[use], items.label[use], w[use], items.bias) if use.sum() >= 2 \
            else np.zeros(items.rows.shape[1])

    inner = _fold_of(raters, min(folds, len(raters)))
    item_inner = [{inner[r] for r in rs if r in inner} for rs in items.raters]
    for _ in range(rounds):
        w = [camp_weight(0), camp_weight(1)]
        # each rater is placed by models fitted without it (in-sample, a camp keeps whoever it starts with)
        ll: dict[int, np.ndarray] = {}
        for g in range(min(folds, len(raters))):
            out = np.array([g not in fs for fs in item_inner])
            held = single & ~out
            if not held.any():
                continue
            ll.update(_rater_loglik(items, [camp_fit(train & out, w[camp]) for camp in (0, 1)], held))
        prior = min(max(float(np.mean(list(pi.values()))) if pi else 0.5, 1e-3), 1 - 1e-3)
        for r in raters:
            d = _logit(prior) + float(ll[r][0] - ll[r][1]) if r in ll else _logit(prior)
            pi[r] = float(_sigmoid(np.array([d]))[0])
    thetas = [camp_fit(train, camp_weight(camp)) for camp in (0, 1)]
    return thetas[0], thetas[1], pi


def _camp_agreement(items: _Items, vote: Mapping[int, float], counts: Mapping[int, float], folds: int
                    ) -> tuple[_Tally, dict[int, float]]:
    """Cross-fitted camps: for each fold of raters, the two-camp mixture is fitted on the items no
    rater of the fold touched, and the fold's raters are scored by the majority camp's model
    (their agreement) and placed by both models (their probability of being in the majority).
    Nothing about a rater enters the model it is judged by, so under feedback the features cannot
    explain this agreement is chance, as for the plain leave-raters-out fit -- but when a
    minority rates the opposite way with more evidence per person (corrections in the opposite
    style, thumbs down on what the majority is content with), the plain fit is pulled to chance
    while the majority camp's model is not."""
    raters = sorted({r for rs in items.raters for r in rs})
    tally = _Tally.empty(raters)
    member: dict[int, float] = {r: 1.0 for r in raters}
    k = min(folds, len(raters))
    fold = _fold_of(raters, k)
    item_folds = [{fold[r] for r in rs} for rs in items.raters]
    single = np.array([len(rs) == 1 for rs in items.raters])
    for f in range(k):
        train = np.array([f not in fs for fs in item_folds])
        held = single & np.array([f in fs for fs in item_folds])
        if not held.any() or train.sum() < 2:
            continue
        first, second, pi = _two_camps(items, train, vote, folds)
        prior = min(max(float(np.mean(list(pi.values()))) if pi else 0.5, 1e-3), 1 - 1e-3)
        ll = _rater_loglik(items, [first, second], held)
        placed = {**pi, **{r: float(_sigmoid(np.array([_logit(prior) + float(a - b)]))[0]) for r, (a, b) in ll.items()}}
        # the majority is counted over every rater, the fold's too (placed by models fitted
        # without them): counted over the other folds only, a fold holding many of the majority
        # left a tie (measured: 10 of 30 honest raters in one fold of 50, 20 contrary elsewhere)
        size = sum(counts.get(r, 1.0) * m for r, m in placed.items())
        flip = size < sum(counts.get(r, 1.0) for r in placed) - size
        major = second if flip else first
        _score_fold(items, major, held, tally)
        for r in ll:
            member[r] = 1.0 - placed[r] if flip else placed[r]
    return tally, member
