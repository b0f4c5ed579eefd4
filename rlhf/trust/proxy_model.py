"""The agreement model: a cheap proxy for the neural reward model.

Every pair and kto row of a bundle is one item: a linear Bradley-Terry item (pairs: features of
the chosen answer minus the rejected one's, "chosen beats rejected") or a logistic one (kto: the
answer's features and a bias, the crowd's share of thumbs up). Features are hashed word unigrams
and bigrams of the answer text plus its log length; the fit is L2-regularised logistic regression
by Newton-CG on sparse features, tens of milliseconds. It never sees the prompt.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import optimize, sparse

from rlhf.data.datasets import DatasetBundle

_FEATURES = 2 ** 18  # hashed n-gram buckets (collisions are rare at this app's vocabulary size)
_L2 = 1.0  # ridge strength of the agreement model (item weights are scaled to mean 1)
_TOKEN = re.compile(r"[a-z0-9']+")


@dataclass
class Items:
    """Every pair and kto row as one item of the agreement model."""

    raters: list[tuple[int, ...]]
    rows: sparse.csr_matrix  # pairs: features(chosen) - features(rejected); kto: features(answer), bias
    label: np.ndarray  # +1 / -1 (pairs: +1, "chosen beats rejected")
    bias: int  # the column of the kto bias (not regularised), -1 without kto rows
    is_kto: np.ndarray  # 1.0 for kto rows, 0.0 for pairs

    def single(self) -> np.ndarray:
        """The items one rater gave alone (a same_prompt pair joins two raters' thumbs: which of
        them it speaks for cannot be told)."""
        return np.array([len(rs) == 1 for rs in self.raters])


def _text(message: list[dict[str, str]]) -> str:
    return message[0]["content"] if message else ""


def _features(texts: Sequence[str]) -> sparse.csr_matrix:
    """Hashed word unigrams and bigrams (present or not) of each text, and its log length."""
    indptr, indices, values = [0], [], []
    for text in texts:
        words = _TOKEN.findall(text.lower())
        grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
        cols = sorted({zlib.crc32(g.encode()) % _FEATURES for g in grams})
        indices += cols + [_FEATURES]
        values += [1.0] * len(cols) + [math.log1p(len(words))]
        indptr.append(len(indices))
    return sparse.csr_matrix((values, indices, indptr), shape=(len(texts), _FEATURES + 2))


def agreement_items(bundle: DatasetBundle) -> Items:
    """Every pair and kto row of ``bundle`` (train and eval) as an item, pairs first."""
    if not any(bundle.pairs[s] or bundle.kto[s] for s in ("train", "eval")):
        return Items(raters=[], rows=sparse.csr_matrix((0, 1)), label=np.zeros(0), bias=-1, is_kto=np.zeros(0))
    pairs = [r for split in ("train", "eval") for r in bundle.pairs[split]]
    kto = [r for split in ("train", "eval") for r in bundle.kto[split]]
    texts: dict[str, int] = {}
    for t in [_text(r["chosen"]) for r in pairs] + [_text(r["rejected"]) for r in pairs] + \
             [_text(r["completion"]) for r in kto]:
        texts.setdefault(t, len(texts))
    x = _features(list(texts))
    chosen = [texts[_text(r["chosen"])] for r in pairs]
    rejected = [texts[_text(r["rejected"])] for r in pairs]
    answers = [texts[_text(r["completion"])] for r in kto]
    bias = sparse.csr_matrix((np.ones(len(kto)), (np.arange(len(kto)), np.full(len(kto), _FEATURES + 1))),
                             shape=(len(kto), _FEATURES + 2))
    rows = sparse.vstack([x[chosen] - x[rejected], x[answers] + bias]).tocsr()
    # only the buckets some item uses (the solver on 2**18 mostly empty dimensions was ~40x slower)
    used = np.unique(rows.indices)
    rows = rows[:, used].tocsr()
    label = np.array([1.0] * len(pairs) + [1.0 if r["label"] else -1.0 for r in kto])
    return Items(raters=[tuple(r.get("raters", ())) for r in pairs + kto], rows=rows, label=label,
                 bias=len(used) - 1 if kto else -1, is_kto=np.array([0.0] * len(pairs) + [1.0] * len(kto)))


def fit(rows: sparse.csr_matrix, label: np.ndarray, weight: np.ndarray, bias: int) -> np.ndarray:
    """L2-regularised logistic regression of ``label`` on ``rows`` (item weights scaled to mean 1);
    the column ``bias`` (the kto bias) is not regularised. Newton-CG with exact Hessian-vector
    products: ~15 Newton steps, tens of milliseconds for a few thousand items."""
    v = weight / weight.mean()
    yx = (sparse.diags(label) @ rows).tocsr()
    yx_t = yx.T.tocsr()
    penalty = np.full(rows.shape[1], _L2)
    if bias >= 0:
        penalty[bias] = 0.0
    curvature: dict[str, Any] = {}

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = yx @ theta
        value = float(v @ np.logaddexp(0.0, -z)) + 0.5 * float(theta @ (penalty * theta))
        return value, -(yx_t @ (v * sigmoid(-z))) + penalty * theta

    def hessp(theta: np.ndarray, p: np.ndarray) -> np.ndarray:
        if curvature.get("at") is None or not np.array_equal(curvature["at"], theta):
            s = sigmoid(yx @ theta)
            curvature.update(at=theta.copy(), d=v * s * (1 - s))
        return yx_t @ (curvature["d"] * (yx @ p)) + penalty * p + 1e-9 * p

    return optimize.minimize(loss, np.zeros(rows.shape[1]), jac=True, hessp=hessp, method="Newton-CG",
                             options={"xtol": 1e-4}).x


def sigmoid(z: np.ndarray) -> np.ndarray:
    """The logistic function (by tanh: no overflow)."""
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def logit(p: float) -> float:
    """log(p / (1 - p)), with ``p`` clipped to [1e-6, 1 - 1e-6]."""
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))
