"""The crowd: what is known of each rater before any agreement is measured.

Per rater: its volume (a row's signal split among its raters), the admin's trust level, the
volume cap (a multiple of the median rater's volume) and whether it is a new identity. A rater
is anyone who gave a pair or kto row; what the web layer knows of them comes as
:class:`RaterInfo`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from rlhf.settings import TrustSettings
from rlhf.trust.vocabulary import TRUST_LEVELS


@dataclass(frozen=True)
class RaterInfo:
    """What the web layer knows about a rater (a user id)."""

    rater: int
    trust: str = "auto"  # the admin's setting: "auto" | "trusted" | "quarantined"
    account_age_hours: float = 0.0
    prior_events: int = 0  # feedback events this rater gave before this cycle's window; 0 if unknown
    signed_in: bool = False  # a signed-in account is not new by ``prior_events`` alone (it is not free)


@dataclass
class Crowd:
    """Every rater with rows (each dict is keyed by them, in the order of their first row)."""

    mass: dict[int, float]  # rows' worth of signal: a row with two raters is half a row each
    events: dict[int, int]  # rows the rater contributed to
    total: float  # the cycle's raw signal: the sum of ``mass``
    admin: dict[int, str]  # the admin's trust level ("auto" for a rater the caller told nothing about)
    median: float  # the median mass of the raters an admin has not quarantined (0 without any)
    volume_cap: dict[int, float]  # <= 1: no rater counts more than max_multiple_of_median x median
    new: dict[int, bool]  # a new identity
    factor_new: dict[int, float]  # new_weight for a new identity, else 1

    @property
    def auto(self) -> list[int]:
        """The raters the assessment decides about (the admin left them on "auto")."""
        return [r for r in self.mass if self.admin[r] == "auto"]

    @property
    def counted(self) -> int:
        """How many raters an admin has not quarantined."""
        return sum(1 for r in self.mass if self.admin[r] != "quarantined")

    @property
    def headcount(self) -> dict[int, float]:
        """What each rater counts as a person: a new identity ``new_weight`` (a swarm of fresh
        accounts agreeing with itself is not a crowd), a rater an admin quarantined nothing."""
        return {r: 0.0 if self.admin[r] == "quarantined" else self.factor_new[r] for r in self.mass}

    def one_vote(self, r: int) -> float:
        """The factor that makes rater ``r``'s items count at most as much as the median rater's
        (one rater, one vote in the agreement fits: otherwise a busy swarm *is* the consensus)."""
        return 1.0 if self.median <= 0 else min(1.0, self.median / self.mass[r])


def validated(raters: Mapping[int, RaterInfo] | None) -> dict[int, RaterInfo]:
    """``raters`` as a dict; ValueError for a trust level that is not one of TRUST_LEVELS."""
    out = dict(raters or {})
    for info in out.values():
        if info.trust not in TRUST_LEVELS:
            raise ValueError(f"rater {info.rater}: trust {info.trust!r} must be one of {', '.join(TRUST_LEVELS)}")
    return out


def is_new(info: RaterInfo | None, settings: TrustSettings) -> bool:
    """New identity: younger than ``new_hours`` or fewer than ``new_events`` earlier events (a
    signed-in account only by its age). A rater the caller told nothing about (``raters`` lacks
    it, e.g. ``run_cycle`` without raters) is not new: its age is unknown, and treating every
    unknown rater as new would only scale every row by the same factor."""
    if info is None or info.trust != "auto":
        return False
    young = info.account_age_hours < settings.new_hours
    silent = info.prior_events < settings.new_events and not info.signed_in
    return young or silent


def crowd_of(item_raters: Sequence[tuple[int, ...]], raters: Mapping[int, RaterInfo],
             settings: TrustSettings) -> Crowd:
    """The crowd of the items whose raters are ``item_raters``, told ``raters``."""
    mass: dict[int, float] = {}  # a row's signal is split among its raters
    events: dict[int, int] = {}
    for rs in item_raters:
        for r in rs:
            mass[r] = mass.get(r, 0.0) + 1.0 / len(rs)
            events[r] = events.get(r, 0) + 1
    admin = {r: (raters[r].trust if r in raters else "auto") for r in mass}
    counted = [m for r, m in mass.items() if admin[r] != "quarantined"]
    median = float(np.median(counted)) if counted else 0.0
    volume_cap = {r: 1.0 if median <= 0 else min(1.0, settings.max_multiple_of_median * median / m)
                  for r, m in mass.items()}
    new = {r: is_new(raters.get(r), settings) for r in mass}
    return Crowd(mass=mass, events=events, total=sum(mass.values()), admin=admin, median=median,
                 volume_cap=volume_cap, new=new, factor_new={r: settings.new_weight if new[r] else 1.0 for r in mass})
