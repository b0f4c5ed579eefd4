"""The words of rater trust, shared with the web app: the admin's trust levels (stored per rater,
checked by the database), the statuses an assessment gives raters and the names of its rules.
Plain tuples: importing this module imports neither numpy nor scipy.
"""
from __future__ import annotations

TRUST_LEVELS: tuple[str, ...] = ("auto", "trusted", "quarantined")  # the admin's setting per rater
RATER_STATUSES: tuple[str, ...] = ("trusted", "normal", "new", "quarantined")
RULES: tuple[str, ...] = ("quarantined", "capped", "down_weighted", "new")
