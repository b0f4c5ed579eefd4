"""The words of rater trust: the admin's trust levels, the statuses and the rules of an assessment."""
from __future__ import annotations

TRUST_LEVELS = ("auto", "trusted", "quarantined")  # the admin's setting per rater
RATER_STATUSES = ("trusted", "normal", "new", "quarantined")
RULES = ("quarantined", "capped", "down_weighted", "new")
