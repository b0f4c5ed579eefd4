"""What is known about each rater before any agreement."""
from __future__ import annotations

from dataclasses import dataclass

from rlhf.settings import TrustSettings


@dataclass(frozen=True)
class RaterInfo:
    """What the web layer knows about a rater (a user id)."""

    rater: int
    trust: str = "auto"  # the admin's setting: "auto" | "trusted" | "quarantined"
    account_age_hours: float = 0.0
    prior_events: int = 0  # feedback events this rater gave before this cycle's window; 0 if unknown
    signed_in: bool = False  # a signed-in account is not new by ``prior_events`` alone (it is not free)



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
