"""Rater weights: the share cap (water-filling)."""
from __future__ import annotations

import math
from typing import Mapping


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
