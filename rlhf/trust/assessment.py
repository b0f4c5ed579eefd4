"""Rater trust: how much each rater's feedback counts in a training cycle.

Without it every rating counts the same, so one person with many anonymous identities (or one
very busy rater) can outvote everyone. Every row of a ``DatasetBundle`` names its raters
(rlhf.data.datasets); :func:`assess_raters` decides a weight per rater and :func:`apply_trust`
turns it into a ``weight`` per row (the trainers use it: rlhf.reward.training,
rlhf.policy.offline) and drops the rows of quarantined raters. Pure: no Flask, no database.

A rater's weight is ``cap x reliability x new``:

* **admin**: "quarantined" always quarantines (weight 0); "trusted" skips the reliability and
  new-identity factors and is never quarantined automatically, but is capped like anyone.
* **caps** (volume): no rater counts more than ``max_multiple_of_median`` times the median
  rater's rows, and no rater makes more than ``max_share`` of the cycle's signal (water-filling
  on the final weights; with fewer than ``1 / max_share`` raters everybody counts the same).
* **reliability**: agreement of a rater's items with a cheap reward model fitted *without* it
  (k folds over raters; pairs say "chosen beats rejected", kto rows "this answer is good/bad"),
  shrunk toward the pooled agreement (``prior_strength`` items) and turned into a
  Dawid-Skene-like log-odds factor relative to the pooled agreement (a typical rater ~1, a
  chance-level one 0, clipped to [0, 1]). Weights -> fit -> agreement -> weights is iterated
  ``iterations`` times from the volume-capped weights. The factor is *applied* only to a rater
  whose own items show, at ``quarantine_p``, that it agrees less than the crowd: honest raters'
  sampling noise costs them nothing (measured: without this, 30 honest simulated raters kept
  only 91-93% of their weight).
* **quarantine**: a rater whose agreement is significantly *below* chance (one-sided binomial
  test, ``p < quarantine_p``, at least ``min_checked`` items) consistently disagrees with
  everyone else: its rows are removed.
* **new identities** (``account_age_hours < new_hours`` or ``prior_events < new_events``) count
  ``new_weight`` unless their agreement is significantly above chance (they graduate).
* **guard**: when the features cannot express what raters prefer (a preference that depends on
  the question, or that looks random to a bag of words) agreement says nothing about a rater:
  reliability and quarantine are not applied (``applied["reliability"] = False`` and a note),
  only the caps and the new-identity rule.

How agreement resists the attack it is meant to catch (each point was a failure measured on
simulated feedback, rlhf.sim.users.simulate_records, before it was added):

* *One rater, one vote in the fit.* Each rater's items count at most as much as the median
  rater's volume, times its current weight; otherwise a swarm rating three times as much *is*
  the consensus.
* *Only single-rater items are scored.* A same_prompt pair joins two raters' thumbs; which of
  them it speaks for cannot be told (it still trains the models).
* *Camps.* Contrary raters do not just add noise: they form a camp whose items (many
  corrections and regenerations: they dislike most answers) carry more evidence per person than
  the honest majority's mostly-thumbs-up. A fit on everyone then sits near chance or even on
  the swarm's side, and Dawid-Skene has a fixed point per camp. Two Dawid-Skene runs (from
  everyone, and from the raters the first distrusted) and a head-to-head vote of the raters
  between them were enough when honest raters were heavy (10 questions each); with light,
  content ones (3 thumbs up each, as in benchmarks/poisoning.py) both runs stayed near chance
  and the guard switched reliability off. So there is a third candidate, selection-free:
  a two-camp mixture (EM; each camp its own model and share of thumbs up, started by splitting
  raters at the median share of thumbs up) is fitted for each fold of raters on the other
  folds only, the camp more *people* are in (a new identity counting ``new_weight``) is the
  majority, and each rater is judged by the majority model fitted without it. When those camps
  are significant (the guard's tests below, on this agreement) this agreement decides: measured
  on the benchmark-shaped simulation (62 light honest raters, 21 or 41 contrary ones at three
  times the volume, 3 seeds x 3 preferences), 76-100% of the contrary raters were quarantined
  and honest raters kept 96-100% of the signal at 25% of the accounts (0.55-1.0 at 40%).
  It is not iterated: reweighting by agreement measured on the same items drifted back toward
  the busy minority. At half of the accounts no agreement rule can tell who is honest.
* *Joined pairs.* A same_prompt pair joins one rater's thumb up and another's thumb down: it
  weighs its least trusted rater's weight and goes when either is quarantined (a pair half made
  of an attacker's judgement is the attacker's).
* *Guard without selection bias.* Fits weighted by agreement measured on the same items make
  even coin-flip judgements look learnable (pooled agreement 0.55 -> 0.65 in three rounds), so
  the guard asks what selection cannot fake: the *first*, unweighted fit or the cross-fitted
  majority camp's model agrees with held-out raters above chance (kto rows by balanced
  accuracy, 0.5 for a model that knows nothing, whatever the share of thumbs up); or raters
  spread around chance beyond what chance allows (Pearson's chi-square over raters, on either
  of those fits: camps that cancel out in a pooled figure still spread); or some rater
  disagrees with the kept fixed point beyond chance after a Bonferroni correction.

The agreement model is a *proxy* for the neural reward model: a linear Bradley-Terry (pairs) and
logistic (kto, with a bias: the crowd's share of thumbs up) model on hashed word unigrams and
bigrams of the answer text plus its log length, L2-regularised, fitted by Newton-CG on sparse
features in tens of milliseconds. The Dawid-Skene runs refit it ``folds`` times per iteration;
the cross-fitted camps ``folds`` x (``folds`` x 2 x 6 + 2) times: 2-12 s a cycle on 2 busy CPU cores
for 60-100 raters. It never sees the prompt.
"""
from __future__ import annotations

import math
import re
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import optimize, sparse, stats

from rlhf.data.datasets import DatasetBundle, criteria_counts
from rlhf.settings import TrustSettings

TRUST_LEVELS = ("auto", "trusted", "quarantined")  # the admin's setting per rater
STATUSES = ("trusted", "normal", "new", "quarantined")
RULES = ("quarantined", "capped", "down_weighted", "new")

_FEATURES = 2 ** 18  # hashed n-gram buckets (collisions are rare at this app's vocabulary size)
_L2 = 1.0  # ridge strength of the agreement model (item weights are scaled to mean 1)
_TOKEN = re.compile(r"[a-z0-9']+")


@dataclass(frozen=True)
class RaterInfo:
    """What the web layer knows about a rater (a user id)."""

    rater: int
    trust: str = "auto"  # the admin's setting: "auto" | "trusted" | "quarantined"
    account_age_hours: float = 0.0
    prior_events: int = 0  # feedback events this rater gave before this cycle's window; 0 if unknown
    signed_in: bool = False  # a signed-in account is not new by ``prior_events`` alone (it is not free)


@dataclass(frozen=True)
class RaterReport:
    rater: int
    events: int  # rows this rater contributed to (pairs + kto) this cycle
    raw_share: float  # share of the signal before any rule
    share: float  # share after the rules (sum over raters = 1)
    agreement: float | None  # shrunk agreement with a model trained without this rater (None: not estimable)
    checked: int  # items the agreement was measured on
    weight: float  # multiplier applied to each of the rater's rows (0 for quarantined)
    status: str  # "trusted" | "normal" | "new" | "quarantined"
    reasons: tuple[str, ...]


@dataclass
class TrustResult:
    raters: dict[int, RaterReport]
    rules: dict[str, dict[str, float]]  # per rule: {"raters", "rows", "weight_removed", "share_removed"}
    applied: dict[str, bool]  # which rules could run
    notes: list[str] = field(default_factory=list)
    pooled_agreement: float | None = None  # of the last iteration (None: not measured)
    weight_kept: float = 1.0  # share of the raw signal the weights keep

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: raters keyed by str(id), tuples as lists. ``weight_removed`` is in rows' worth
        of signal (a row with two raters is half a row each), ``share_removed`` the same as a share
        of the cycle's raw signal."""
        return {"raters": {str(r): {**asdict(rep), "reasons": list(rep.reasons)} for r, rep in self.raters.items()},
                "rules": {k: dict(v) for k, v in self.rules.items()}, "applied": dict(self.applied),
                "notes": list(self.notes), "pooled_agreement": self.pooled_agreement,
                "weight_kept": self.weight_kept}


# ---------------------------------------------------------------------------- items

@dataclass
class _Items:
    """Every pair and kto row as one item of the agreement model."""

    raters: list[tuple[int, ...]]
    rows: sparse.csr_matrix  # pairs: features(chosen) - features(rejected); kto: features(answer), bias
    label: np.ndarray  # +1 / -1 (pairs: +1, "chosen beats rejected")
    bias: int  # the column of the kto bias (not regularised), -1 without kto rows
    is_kto: np.ndarray  # 1.0 for kto rows, 0.0 for pairs


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


def _items(bundle: DatasetBundle) -> _Items:
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
    return _Items(raters=[tuple(r.get("raters", ())) for r in pairs + kto], rows=rows, label=label,
                  bias=len(used) - 1 if kto else -1, is_kto=np.array([0.0] * len(pairs) + [1.0] * len(kto)))


def _fit(rows: sparse.csr_matrix, label: np.ndarray, weight: np.ndarray, bias: int) -> np.ndarray:
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
        return value, -(yx_t @ (v * _sigmoid(-z))) + penalty * theta

    def hessp(theta: np.ndarray, p: np.ndarray) -> np.ndarray:
        if curvature.get("at") is None or not np.array_equal(curvature["at"], theta):
            s = _sigmoid(yx @ theta)
            curvature.update(at=theta.copy(), d=v * s * (1 - s))
        return yx_t @ (curvature["d"] * (yx @ p)) + penalty * p + 1e-9 * p

    return optimize.minimize(loss, np.zeros(rows.shape[1]), jac=True, hessp=hessp, method="Newton-CG",
                             options={"xtol": 1e-4}).x


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


# ---------------------------------------------------------------------------- caps

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


# ---------------------------------------------------------------------------- assessment

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


@dataclass
class _State:
    """One Dawid-Skene run: the factors it settled on and what they rest on."""

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


def _head_to_head(a: "_State", b: "_State", counts: Mapping[int, float]) -> "_State":
    """The fixed point more people side with: each rater (counted ``counts[r]``: a new identity
    ``new_weight``, as a swarm of fresh accounts agreeing with itself is not a crowd) backs the one
    its own items agree with more (a tie: half each). Absolute counts ("raters above 0.5") failed
    here: a blurred fixed point that half-agrees with everybody tied with the honest one."""
    for st, other in ((a, b), (b, a)):
        st.support = sum(counts.get(r, 0.0) * (1.0 if st.raw[r] > other.raw[r] else 0.5 if st.raw[r] == other.raw[r]
                                               else 0.0) for r in st.raw if r in other.raw)
    return a if a.support >= b.support else b


def _is_new(info: RaterInfo | None, settings: TrustSettings) -> bool:
    """New identity: younger than ``new_hours`` or fewer than ``new_events`` earlier events (a
    signed-in account only by its age). A rater the caller told nothing about (``raters`` lacks
    it, e.g. ``run_cycle`` without raters) is not new: its age is unknown, and treating every
    unknown rater as new would only scale every row by the same factor."""
    if info is None or info.trust != "auto":
        return False
    young = info.account_age_hours < settings.new_hours
    silent = info.prior_events < settings.new_events and not info.signed_in
    return young or silent


def assess_raters(bundle: DatasetBundle, raters: Mapping[int, RaterInfo] | None,
                  settings: TrustSettings = TrustSettings()) -> TrustResult:
    """Each rater's weight in ``bundle`` (see the module's docstring for the rules)."""
    raters = dict(raters or {})
    for info in raters.values():
        if info.trust not in TRUST_LEVELS:
            raise ValueError(f"rater {info.rater}: trust {info.trust!r} must be one of {', '.join(TRUST_LEVELS)}")
    items = _items(bundle) if any(bundle.pairs[s] or bundle.kto[s] for s in ("train", "eval")) else \
        _Items(raters=[], rows=sparse.csr_matrix((0, 1)), label=np.zeros(0), bias=-1, is_kto=np.zeros(0))
    mass: dict[int, float] = {}  # a row's signal is split among its raters
    events: dict[int, int] = {}
    for rs in items.raters:
        for r in rs:
            mass[r] = mass.get(r, 0.0) + 1.0 / len(rs)
            events[r] = events.get(r, 0) + 1
    total = sum(mass.values())
    notes: list[str] = []
    admin = {r: (raters[r].trust if r in raters else "auto") for r in mass}
    counted = [m for r, m in mass.items() if admin[r] != "quarantined"]
    median = float(np.median(counted)) if counted else 0.0
    volume_cap = {r: 1.0 if median <= 0 else min(1.0, settings.max_multiple_of_median * median / m)
                  for r, m in mass.items()}
    new = {r: _is_new(raters.get(r), settings) for r in mass}
    factor_new = {r: settings.new_weight if new[r] else 1.0 for r in mass}
    auto = [r for r in mass if admin[r] == "auto"]

    def weights(state: _State | None, soft: bool = False) -> dict[int, float]:
        out = {}
        for r in mass:
            if admin[r] == "quarantined" or (state is not None and r in state.quarantined):
                out[r] = 0.0
            elif admin[r] == "trusted":
                out[r] = volume_cap[r]
            elif state is None:
                out[r] = volume_cap[r] * factor_new[r]
            else:
                out[r] = volume_cap[r] * (state.soft if soft else state.reliability)[r] * \
                    (1.0 if r in state.graduated else factor_new[r])
        return out

    def votes(state: _State) -> tuple[dict[int, float], np.ndarray]:
        """One rater, one vote (up to the median volume) times its current weight; per item the
        mean of its raters' votes (a row without raters: 1)."""
        current = weights(state, soft=True)
        vote = {r: current[r] * (1.0 if median <= 0 else min(1.0, median / mass[r])) for r in mass}
        return vote, np.array([np.mean([vote[r] for r in rs]) if rs else 1.0 for rs in items.raters])

    def decide(state: _State, tally: _Tally, vote: Mapping[int, float]) -> None:
        correct, checked = tally.plain()
        pooled, _ = _pooled(correct, checked, vote)
        if pooled is None:
            return
        state.pooled = pooled
        # at or below chance the reference sits just above it: raters on the majority's side keep
        # their weight and the others lose it, so the next fit sides with one camp (which camp is
        # kept is decided by people, below)
        ref = max(pooled, 0.5 + 1e-3)
        state.quarantined, state.graduated, state.raw = {}, {}, {}
        for r in mass:
            n, c = checked[r], correct[r]
            state.checked[r] = n
            shrunk = (c + settings.prior_strength * ref) / (n + settings.prior_strength) \
                if n + settings.prior_strength > 0 else ref
            state.agreement[r] = shrunk if n else None
            if n:
                state.raw[r] = c / n
            if admin[r] != "auto":
                continue
            state.soft[r] = min(1.0, max(0.0, _logit(shrunk) / _logit(ref)))
            # benefit of the doubt: the factor applies only when the rater's own items show, at
            # the trust decisions' level, that it agrees less than the crowd (honest raters'
            # sampling noise then costs them nothing)
            below = n > 0 and float(stats.binom.cdf(c, n, ref)) < settings.quarantine_p
            state.reliability[r] = state.soft[r] if below else 1.0
            if n >= settings.min_checked:
                low = float(stats.binom.cdf(c, n, 0.5))
                if low < settings.quarantine_p:
                    state.quarantined[r] = low
                high = float(stats.binom.sf(c - 1, n, 0.5))
                if new[r] and high < settings.quarantine_p:
                    state.graduated[r] = high

    single = np.array([len(rs) == 1 for rs in items.raters])
    everything = np.ones(len(items.raters), bool)

    def run(start: Mapping[int, float], label: str) -> _State:
        """Weights -> leave-raters-out fits -> agreement -> weights, ``iterations`` times."""
        state = _State(soft=dict(start), reliability=dict(start))
        for it in range(settings.iterations):
            vote, fit_weight = votes(state)
            if not fit_weight.any():
                break
            tally = _agreement(items, fit_weight, settings.folds, everything, single)
            if it == 0:
                state.first = _pooled(*tally.balanced(), vote)
                state.dispersion_p = _dispersion(*tally.balanced())
            decide(state, tally, vote)
            state.notes.append(
                f"{label} iteration {it + 1}: agreement {state.pooled if state.pooled is not None else 0:.3f} on "
                f"{sum(state.checked.values())} rater-items; {len(state.quarantined)} below chance, "
                f"{sum(1 for r in auto if state.soft[r] < 0.5)} below half weight")
        state.valid = state.pooled is not None and state.pooled > 0.5
        return state

    applied = {"caps": True, "new": any(new.values()), "reliability": False, "quarantine": False}
    chosen: _State | None = None
    if settings.iterations == 0:
        notes.append("reliability off (iterations = 0): only the caps and the new-identity rule act")
    elif sum(1 for r in mass if admin[r] != "quarantined") < 2:
        notes.append("reliability not measured: fewer than 2 raters")
    else:
        first = run({r: 1.0 for r in mass}, "from everyone:")
        runs = [first]
        # Raters who contradict each other form camps, and Dawid-Skene has a fixed point per camp:
        # volume decides which one a run from everyone finds. So a second run starts from the
        # raters the first distrusted, and the fixed point more people agree with is kept.
        flipped = {r: (1.0 if r in first.quarantined else 1.0 - first.soft[r]) if admin[r] == "auto" else 1.0
                   for r in mass}
        if any(flipped[r] > 0.5 for r in auto):
            runs.append(run(flipped, "from the distrusted:"))
        # Both can miss the honest camp when it is content and light (three thumbs up each) and a
        # minority is dissatisfied and busy: the plain fits then sit near chance. A two-camp
        # mixture, cross-fitted over raters, finds the camps anyway (each has its own share of
        # thumbs up); its majority model's agreement with each rater, measured without that
        # rater, is a third candidate. It is not iterated: reweighting by agreement measured on
        # the same items drifted back toward the busy minority (measured: 29 -> 4 of 41 contrary
        # raters below chance in three rounds).
        counts = {r: 0.0 if admin[r] == "quarantined" else factor_new[r] for r in mass}
        # one rater, one vote, and nothing else: with the volume cap on top (as in the runs'
        # fits) a busy camp's own model was too thin to form, and the split came out muddled
        vote0 = {r: 0.0 if admin[r] == "quarantined" else 1.0 if median <= 0 else min(1.0, median / mass[r])
                 for r in mass}
        camp_tally, member = _camp_agreement(items, vote0, counts, settings.folds)
        camp = _pooled(*camp_tally.balanced(), vote0)
        camp_dispersion = _dispersion(*camp_tally.balanced())
        notes.append(f"camps: the majority camp's model (fitted without each fold) agrees with the raters' own items "
                     f"{camp[0] if camp[0] is not None else 0:.3f} (balanced, by people), spread beyond chance "
                     f"p = {camp_dispersion:.2g}; {sum(1 for r in auto if member.get(r, 1.0) < 0.5)} raters placed "
                     f"in the minority")
        start = {r: member.get(r, 1.0) if admin[r] == "auto" else 1.0 for r in mass}
        by_camp = _State(soft=dict(start), reliability=dict(start))
        # the crowd it compares a rater with is the majority camp (everyone would include the minority)
        decide(by_camp, camp_tally, {r: v * member.get(r, 1.0) for r, v in vote0.items()})
        by_camp.valid = by_camp.pooled is not None and (
            min(camp_dispersion, camp[1] if camp[0] is not None and camp[0] > 0.5 else 1.0) < settings.quarantine_p)
        by_camp.notes.append(f"from the majority camp: agreement {by_camp.pooled or 0:.3f} on "
                             f"{sum(by_camp.checked.values())} rater-items; {len(by_camp.quarantined)} below chance, "
                             f"{sum(1 for r in auto if by_camp.soft[r] < 0.5)} below half weight")
        runs.append(by_camp)
        for st in runs:
            notes += st.notes
        valid = [st for st in runs if st.valid]
        chosen = None
        if by_camp.valid:
            # selection-free (no rater's items choose the model it is judged by), so it is not
            # put head to head with the Dawid-Skene runs, whose agreement is inflated by
            # reweighting on the same items
            chosen = by_camp
        else:
            for st in valid:
                chosen = st if chosen is None else _head_to_head(chosen, st, counts)
        # The guard. Later fits are weighted by agreement measured on the same items, so even a
        # preference the features cannot express ends up looking learnable (measured on coin-flip
        # judgements: pooled agreement 0.55 -> 0.65 in three rounds). So it asks two questions
        # that selection cannot fake: does the first, unweighted fit agree with held-out raters
        # above chance; or, when camps cancel out in that fit, does some rater disagree with the
        # kept fixed point beyond chance even after a Bonferroni correction over all raters.
        balanced, balanced_p = first.first
        camps = chosen is not None and any(p * len(mass) < settings.quarantine_p for p in chosen.quarantined.values())
        dispersed = min(first.dispersion_p, camp_dispersion) < settings.quarantine_p
        majority = camp[0] is not None and camp[0] > 0.5 and camp[1] < settings.quarantine_p
        if not ((balanced is not None and balanced > 0.5 and balanced_p < settings.quarantine_p) or camps
                or dispersed or majority):
            shown = "none" if balanced is None else f"{balanced:.3f} (p = {balanced_p:.2g})"
            notes.append(f"reliability not applied: the leave-raters-out agreement is not significantly above "
                         f"chance (balanced {shown}), raters do not spread beyond chance around it (p = "
                         f"{min(first.dispersion_p, camp_dispersion):.2g}), the majority camp's model does not predict "
                         f"held-out raters either, and no rater disagrees beyond chance: the features cannot "
                         f"express what raters prefer, so agreement says nothing about a rater")
            chosen = None
        elif chosen is not None:
            applied["reliability"] = applied["quarantine"] = True
            if chosen is by_camp:
                notes.append("kept the majority camp's agreement: the camps are significant, and it is measured "
                             "without selection")
            else:
                notes.append(f"kept the run {chosen.notes[0].split(':')[0] if chosen.notes else ''}"
                             + (f": head to head, more raters side with it ({chosen.support:g}, new identities "
                                f"counting {settings.new_weight:g})" if len(valid) > 1 else ": the only valid run"))
    quarantined = chosen.quarantined if chosen else {}
    graduated = chosen.graduated if chosen else {}
    reliability = {r: chosen.reliability.get(r, 1.0) for r in mass} if chosen else {r: 1.0 for r in mass}
    agreement = {r: chosen.agreement.get(r) for r in mass} if chosen else {r: None for r in mass}
    checked = {r: chosen.checked.get(r, 0) for r in mass} if chosen else {r: 0 for r in mass}
    pooled_out = chosen.pooled if chosen else None

    base = weights(chosen)
    fill = water_fill({r: mass[r] * base[r] for r in mass}, settings.max_share)
    final = {r: base[r] * fill[r] for r in mass}
    cap = {r: volume_cap[r] * fill[r] for r in mass}
    kept = sum(mass[r] * final[r] for r in mass)

    reports: dict[int, RaterReport] = {}
    rules = {name: {"raters": 0, "rows": 0, "weight_removed": 0.0} for name in RULES}

    def rule(name: str, r: int, removed: float) -> None:
        rules[name]["raters"] += 1
        rules[name]["rows"] += events[r]
        rules[name]["weight_removed"] += removed

    for r in sorted(mass):
        reasons: list[str] = []
        m = mass[r]
        if admin[r] == "quarantined" or r in quarantined:
            status = "quarantined"
            reasons.append("quarantined by an admin" if admin[r] == "quarantined"
                           else f"quarantined: disagrees, p={quarantined[r]:.2g}")
            rule("quarantined", r, m)
        else:
            status = "trusted" if admin[r] == "trusted" else "normal"
            if admin[r] == "trusted":
                reasons.append("trusted by an admin")
            left = m
            if cap[r] < 1 - 1e-9:
                reasons.append("capped")
                rule("capped", r, left * (1 - cap[r]))
                left *= cap[r]
            if admin[r] == "auto" and reliability[r] < 1 - 1e-9:
                reasons.append(f"down-weighted: agreement {agreement[r] if agreement[r] is not None else 0:.2f}")
                rule("down_weighted", r, left * (1 - reliability[r]))
                left *= reliability[r]
            if new[r] and r in graduated:
                reasons.append(f"graduated: agrees, p={graduated[r]:.2g}")
            elif new[r]:
                status = "new"
                reasons.append("new identity")
                rule("new", r, left * (1 - settings.new_weight))
        reports[r] = RaterReport(
            rater=r, events=events[r], raw_share=round(m / total, 6) if total else 0.0,
            share=round(m * final[r] / kept, 6) if kept > 0 else 0.0,
            agreement=None if agreement[r] is None else round(float(agreement[r]), 4), checked=int(checked[r]),
            weight=round(final[r], 6), status=status, reasons=tuple(reasons))
    for name in RULES:
        rules[name]["weight_removed"] = round(rules[name]["weight_removed"], 4)
        rules[name]["share_removed"] = round(rules[name]["weight_removed"] / total, 4) if total else 0.0
    if any(fill[r] < 1 - 1e-9 for r in mass):
        live = sum(1 for r in mass if base[r] > 0)
        notes.append(f"share cap: no rater above {settings.max_share:g} of the signal" if
                     live * settings.max_share >= 1 - 1e-9 else
                     f"share cap: {live} raters are fewer than 1/max_share = {1 / settings.max_share:g}: every "
                     f"rater counts the same")
    return TrustResult(raters=reports, rules=rules, applied=applied, notes=notes,
                       pooled_agreement=None if pooled_out is None else round(float(pooled_out), 4),
                       weight_kept=round(kept / total, 4) if total else 1.0)


# ---------------------------------------------------------------------------- applying

JOINED_SOURCES = ("same_prompt", "rated")  # rows built from several raters' separate judgements


def row_weight(row: Mapping[str, Any], result: TrustResult) -> float | None:
    """A row's weight: the mean of its raters' weights when they gave it identically (a rater the
    result does not know, and a row without raters, count 1), None when every one of them is
    quarantined (drop it). A row joined from several raters' separate judgements (a same_prompt
    pair) weighs its least trusted rater's weight, and is dropped when any of them is quarantined."""
    raters = tuple(row.get("raters", ()))
    if not raters:
        return 1.0
    reports = [result.raters.get(r) for r in raters]
    out = [rep is not None and rep.status == "quarantined" for rep in reports]
    weights = [1.0 if rep is None else rep.weight for rep in reports]
    if row.get("source") in JOINED_SOURCES:
        # the pair stands on each rater's judgement (one liked the chosen answer, another
        # disliked the rejected one): it is as trustworthy as the least trusted of them
        return None if any(out) else float(min(weights))
    if all(out):
        return None
    return float(np.mean(weights))


def apply_trust(bundle: DatasetBundle, result: TrustResult) -> DatasetBundle:
    """A new bundle: rows whose raters are all quarantined removed (prompts too: PPO/RLOO never
    roll out a quarantined rater's prompts), every other pair, kto and sft row with ``weight``
    (prompts are not weighted); ``counts`` updated, with the trust summary under "trust"."""
    out = DatasetBundle()
    removed: dict[str, int] = {}
    for kind in ("pairs", "kto", "sft", "prompts", "criteria", "rated"):
        source = getattr(bundle, kind)
        kept: dict[str, list[dict[str, Any]]] = {}
        gone = 0
        for split, rows in source.items():
            kept[split] = []
            for row in rows:
                w = row_weight(row, result)
                if w is None:
                    gone += 1
                elif kind == "prompts":
                    kept[split].append(dict(row))
                else:
                    kept[split].append({**row, "weight": round(w, 6)})
        setattr(out, kind, kept)
        removed[kind] = gone
    out.counts = {**bundle.counts,
                  **{kind: {s: len(r) for s, r in getattr(out, kind).items()}
                     for kind in ("pairs", "kto", "sft", "prompts")},
                  "criteria": criteria_counts(out.criteria),
                  "rated_pairs": {s: len(r) for s, r in out.rated.items()},
                  "kto_positive": sum(r["label"] for rows in out.kto.values() for r in rows),
                  "trust": {**result.to_dict(), "rows_removed": removed}}
    return out


def trusted_bundle(bundle: DatasetBundle, raters: Mapping[int, RaterInfo] | None,
                   settings: TrustSettings) -> DatasetBundle:
    """``bundle`` weighed by its raters when ``settings.enabled`` (else unchanged)."""
    if not settings.enabled:
        return bundle
    return apply_trust(bundle, assess_raters(bundle, raters, settings))


# ---------------------------------------------------------------------------- trainers

def normalized_weights(rows: Sequence[Mapping[str, Any]]) -> list[float] | None:
    """The rows' weights scaled to mean 1 (so the learning rate keeps its meaning), or None when
    no row has one or all are equal (training is then exactly unweighted)."""
    if not rows or not any("weight" in r for r in rows):
        return None
    w = [float(r.get("weight", 1.0)) for r in rows]
    if min(w) == max(w):
        return None
    mean = sum(w) / len(w)
    if mean <= 0:
        raise ValueError("every row has weight 0: nothing to train on")
    return [x / mean for x in w]


def resample_by_weight(rows: Sequence[Mapping[str, Any]], seed: int = 0) -> list[Mapping[str, Any]]:
    """Weighted resampling for trainers whose loss is not overridden (DPO, KTO, SFT): each row
    appears ``floor`` or ``ceil`` of its normalised weight times (systematic resampling with a
    seeded offset), so the data keeps its size and a row of weight 0 is gone. Rows without weights,
    or with equal weights, come back unchanged (same order: the same training)."""
    w = normalized_weights(rows)
    if w is None:
        return list(rows)
    offset = np.random.default_rng(seed).random()
    out: list[Mapping[str, Any]] = []
    before = 0.0
    for row, x in zip(rows, w):
        after = before + x
        out += [row] * (math.floor(after + offset) - math.floor(before + offset))
        before = after
    return out
