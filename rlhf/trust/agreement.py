"""Leave-raters-out agreement: what a model fitted without a rater makes of its items."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats

from rlhf.trust.proxy_model import _fit, _Items


@dataclass
class _Tally:
    """What a leave-raters-out model made of each rater's items: pairs it agrees with / checked,
    and per kto label (good, bad): rows it agrees with / rows."""

    pair_ok: dict[int, int]
    pair_n: dict[int, int]
    kto: dict[int, np.ndarray]  # good labels right, good labels, bad labels right, bad labels

    @classmethod
    def empty(cls, raters: Iterable[int]) -> "_Tally":
        raters = list(raters)
        return cls({r: 0 for r in raters}, {r: 0 for r in raters}, {r: np.zeros(4) for r in raters})

    def __add__(self, other: "_Tally") -> "_Tally":
        return _Tally({r: n + other.pair_ok[r] for r, n in self.pair_ok.items()},
                      {r: n + other.pair_n[r] for r, n in self.pair_n.items()},
                      {r: a + other.kto[r] for r, a in self.kto.items()})

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


def _pooled(correct: Mapping[int, float], checked: Mapping[int, float], vote: Mapping[int, float]
            ) -> tuple[float | None, float]:
    """Agreement pooled over raters weighted by ``vote``, and the one-sided p-value of "above 0.5"
    (normal approximation with Kish's effective number of items)."""
    num = sum(vote.get(r, 0.0) * correct[r] for r in correct)
    den = sum(vote.get(r, 0.0) * checked[r] for r in correct)
    if den <= 0:
        return None, 1.0
    n_eff = den ** 2 / max(1e-12, sum(vote.get(r, 0.0) ** 2 * checked[r] for r in correct))
    return num / den, float(stats.norm.sf((num / den - 0.5) / math.sqrt(0.25 / n_eff)))


def _fold_of(raters: Iterable[int], folds: int) -> dict[int, int]:
    order = sorted(raters)
    perm = np.random.default_rng(0).permutation(len(order))
    return {order[i]: k % folds for k, i in enumerate(perm)}


def _agreement(items: _Items, fit_weight: np.ndarray, folds: int, fit_on: np.ndarray,
               score_on: np.ndarray) -> _Tally:
    """Leave-raters-out agreement: for each fold of raters, fit on the ``fit_on`` items no rater of
    the fold touched (weighted by ``fit_weight``), and score the fold's raters' ``score_on``
    items. A pair agrees when the model scores chosen above rejected (a tie, same features, is no
    evidence); a kto row when the model's good/bad call (its score against its fitted bias: the
    crowd's share of thumbs up) matches the label, so a rater calling bad what nearly everyone
    calls good disagrees even where the features cannot say why."""
    raters = sorted({r for rs in items.raters for r in rs})
    tally = _Tally.empty(raters)
    k = min(folds, len(raters))
    fold = _fold_of(raters, k)
    item_folds = [{fold[r] for r in rs} for rs in items.raters]
    for f in range(k):
        train = fit_on & (fit_weight > 0) & np.array([f not in fs for fs in item_folds])
        held = score_on & np.array([f in fs for fs in item_folds])
        if not held.any() or train.sum() < 2:
            continue
        _score_fold(items, _fit(items.rows[train], items.label[train], fit_weight[train], items.bias), held, tally)
    return tally


def _score_fold(items: _Items, theta: np.ndarray, held: np.ndarray, tally: _Tally) -> None:
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


def _rater_loglik(items: _Items, thetas: Sequence[np.ndarray], mask: np.ndarray) -> dict[int, np.ndarray]:
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

def _dispersion(correct: Mapping[int, float], checked: Mapping[int, float]) -> float:
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
