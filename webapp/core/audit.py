"""The audit log: who decided what (promotions, experiments, runs, admin actions)."""
from __future__ import annotations

from flask_login import current_user

from webapp.core.extensions import db
from webapp.core.identity import is_admin
from webapp.core.models import AuditEvent


def audit(action: str, subject: str = "", **detail) -> None:
    """Record a decision (committed with the caller's transaction). ``actor`` defaults to the
    logged-in admin."""
    named = detail.pop("actor", None)
    actor = current_user.username if is_admin() else (named or "system")
    db.session.add(AuditEvent(actor=actor, action=action, subject=subject, detail=detail))
