"""Agreement: the evidence each rater's own items give about it.

Raters are split into folds; each fold's raters are scored by an agreement model fitted on the
items no rater of the fold touched (rlhf.trust.proxy_model), so nothing a rater gave enters the
model it is judged by. A :class:`Tally` counts, per rater, the items that model agrees with;
:func:`pooled` and :func:`dispersion` summarise it over raters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

from rlhf.trust.proxy_model import Items, fit


@dataclass
class Tally:
    """What a leave-raters-out model made of each rater's items: pairs it agrees with / checked,
    and per kto label (good, bad): rows it agrees with / rows."""

    pair_ok: dict[int, int]
    pair_n: dict[int, int]
    kto: dict[int, np.ndarray]  # good labels right, good labels, bad labels right, bad labels

    @classmethod
    def empty(cls, raters: Iterable[int]) -> Tally:
        raters = list(raters)
        return cls({r: 0 for r in raters}, {r: 0 for r in raters}, {r: np.zeros(4) for r in raters})

    def plain(self) -> tuple[dict[int, int], dict[int, int]]:
        """Items agreeing and items checked: a kto row agrees when the model's good/bad call matches."""
        return ({r: self.pair_ok[r] + int(k[0] + k[2]) for r, k in self.kto.items()},
                {r: self.pair_n[r] + int(k[1] + k[3]) for r, k in self.kto.items()})

    def balanced(self) -> tuple[dict[int, float], dict[int, float]]:
        """The same with kto rows by balanced accuracy (the mean of the shares of a rater's good and
        of its bad labels the model gets right), counted as ``2 n+ n- / (n+ + n-)`` items: 0.5 for a
        model that knows nothing, whatever the rater's share of thumbs up."""
        correct, checked = {}, {}
        for r, (good_ok, good, bad_ok, bad) in self.kto.items():
            n = 2 * good * bad / (good + bad) if good and bad else 0.0
            checked[r] = self.pair_n[r] + n
            correct[r] = self.pair_ok[r] + (n * (good_ok / good + bad_ok / bad) / 2 if n else 0.0)
        return correct, checked


def pooled(correct: Mapping[int, float], checked: Mapping[int, float], vote: Mapping[int, float]
            ) -> tuple[float | None, float]:
    """Agreement pooled over raters weighted by ``vote``, and the one-sided p-value of "above 0.5"
    (normal approximation with Kish's effective number of items)."""
    num = sum(vote.get(r, 0.0) * correct[r] for r in correct)
    den = sum(vote.get(r, 0.0) * checked[r] for r in correct)
    if den <= 0:
        return None, 1.0
    n_eff = den ** 2 / max(1e-12, sum(vote.get(r, 0.0) ** 2 * checked[r] for r in correct))
    return num / den, float(stats.norm.sf((num / den - 0.5) / math.sqrt(0.25 / n_eff)))


def fold_of(raters: Iterable[int], folds: int) -> dict[int, int]:
    """Each rater's fold, ``0 .. folds - 1``: a fixed (seed 0) shuffle of the sorted raters, dealt in turn."""
    order = sorted(raters)
    perm = np.random.default_rng(0).permutation(len(order))
    return {order[i]: k % folds for k, i in enumerate(perm)}


def leave_raters_out(items: Items, fit_weight: np.ndarray, folds: int, fit_on: np.ndarray,
                     score_on: np.ndarray) -> Tally:
    """Leave-raters-out agreement: for each fold of raters, fit on the ``fit_on`` items no rater of
    the fold touched (weighted by ``fit_weight``), and score the fold's raters' ``score_on``
    items. A pair agrees when the model scores chosen above rejected (a tie, same features, is no
    evidence); a kto row when the model's good/bad call (its score against its fitted bias: the
    crowd's share of thumbs up) matches the label, so a rater calling bad what nearly everyone
    calls good disagrees even where the features cannot say why."""
    raters = sorted({r for rs in items.raters for r in rs})
    tally = Tally.empty(raters)
    k = min(folds, len(raters))
    fold = fold_of(raters, k)
    item_folds = [{fold[r] for r in rs} for rs in items.raters]
    for f in range(k):
        train = fit_on & (fit_weight > 0) & np.array([f not in fs for fs in item_folds])
        held = score_on & np.array([f in fs for fs in item_folds])
        if not held.any() or train.sum() < 2:
            continue
        score_fold(items, fit(items.rows[train], items.label[train], fit_weight[train], items.bias), held, tally)
    return tally


def score_fold(items: Items, theta: np.ndarray, held: np.ndarray, tally: Tally) -> None:
    """Add what ``theta`` makes of the ``held`` items (single-rater ones) to ``tally``."""
    margin = (items.rows[held] @ theta) * items.label[held]
    for i, m in zip(np.flatnonzero(held), margin):
        r = items.raters[i][0]
        if items.is_kto[i] == 0:
            if abs(m) > 1e-9:
                tally.pair_n[r] += 1
                tally.pair_ok[r] += int(m > 0)
        else:
            tally.kto[r] += (m > 0, 1, 0, 0) if items.label[i] > 0 else (0, 0, m > 0, 1)


def rater_loglik(items: Items, thetas: Sequence[np.ndarray], mask: np.ndarray) -> dict[int, np.ndarray]:
    """Per rater, the log-likelihood of its own single-rater ``mask`` items under each model."""
    out: dict[int, np.ndarray] = {}
    idx = np.flatnonzero(mask)
    if not len(idx):
        return out
    z = np.stack([(items.rows[idx] @ th) * items.label[idx] for th in thetas], axis=1)
    ll = -np.logaddexp(0.0, -z)
    for i, row in zip(idx, ll):
        r = items.raters[i][0]
        out[r] = out.get(r, 0.0) + row
    return out

def dispersion(correct: Mapping[int, float], checked: Mapping[int, float]) -> float:
    """p-value of "every rater agrees with the held-out fit at chance" (Pearson's chi-square over
    raters, one degree of freedom each). When the features cannot express what raters prefer,
    each rater's leave-raters-out agreement is a coin flip; camps that cancel out in the pooled
    agreement (a quarter of the raters far below chance, the rest above) still spread far beyond
    it. Balanced kto counts vary less than binomial ones under that null, so the test is
    conservative there."""
    stat, df = 0.0, 0
    for r, n in checked.items():
        if n > 0:
            stat += (correct[r] - n / 2) ** 2 / (n / 4)
            df += 1
    return float(stats.chi2.sf(stat, df)) if df else 1.0
