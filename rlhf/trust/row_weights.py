"""From rater weights to row weights, and what the trainers do with them.

:func:`apply_trust` gives every row of a bundle the weight of the raters who gave it and drops
the rows of quarantined raters; the reward trainer multiplies each pair's loss by the weight
(:func:`normalized_weights`), trainers whose loss is TRL's own resample rows by it
(:func:`resample_by_weight`).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from rlhf.data.datasets import DatasetBundle, criteria_counts
from rlhf.trust.report import TrustResult

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
