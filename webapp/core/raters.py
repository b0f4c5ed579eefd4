"""Raters: the admin's trust setting per user, the latest training run's assessment of each rater,
and who is left out of A/B verdicts.

* ``rater_trust``: what an admin decided (``auto``: the assessment decides; ``trusted``: never
  quarantined automatically; ``quarantined``: left out), with a note, who and when.
* ``rater_assessments``: the latest training run's assessment per rater (rlhf.trust's
  output: events, raw_share, share, agreement, checked, weight, status, reasons), stored by
  :func:`store_assessments`. A rater absent from a later run keeps their last assessment, which
  names its run.
* :func:`excluded_raters`: the users whose feedback and votes are counted out of A/B metrics --
  admins (they can see which arm answered), users an admin quarantined, and users the latest
  assessment quarantined unless an admin set them ``trusted``. Their chats are still answered and
  their rows stay in the database.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from rlhf.trust.vocabulary import TRUST_LEVELS
from webapp.core.extensions import db
from webapp.core.models import RaterAssessment, RaterTrust, User, iso, utcnow

__all__ = ["trust_settings", "set_trust", "store_assessments", "excluded_raters", "assessment_dict"]


def trust_settings(user_ids: list[int] | None = None) -> dict[int, str]:
    """The admin's setting of every user who has one (``auto`` for everyone else); only
    ``user_ids`` when given."""
    q = db.select(RaterTrust.user_id, RaterTrust.trust)
    if user_ids is not None:
        if not user_ids:
            return {}
        q = q.where(RaterTrust.user_id.in_(user_ids))
    return {uid: trust for uid, trust in db.session.execute(q)}


def set_trust(user_id: int, trust: str, note: str | None, set_by: int | None) -> tuple[str, RaterTrust]:
    """Set a rater's trust (the caller commits and audits). Returns (old setting, row)."""
    if trust not in TRUST_LEVELS:
        raise ValueError(f"trust must be one of {', '.join(TRUST_LEVELS)}")
    row = db.session.get(RaterTrust, user_id)
    old = row.trust if row is not None else "auto"
    if row is None:
        row = RaterTrust(user_id=user_id)
        db.session.add(row)
    row.trust, row.note, row.set_by, row.set_at = trust, note, set_by, utcnow()
    return old, row


def _number(value: Any, default: float | None = 0.0) -> float | None:
    if value is None or isinstance(value, bool):
        return default
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if math.isfinite(out) else default


def store_assessments(run_id: int | None, raters: Mapping[int | str, Mapping[str, Any]]) -> int:
    """Upsert the latest assessment of each rater from rlhf.trust's per-rater dicts
    (``{user_id: {"rater", "events", "raw_share", "share", "agreement", "checked", "weight",
    "status", "reasons"}}``, keys as int or str) and commit. Raters that are not users (any more)
    are skipped. Returns the number of rows stored."""
    ids: dict[int, Mapping[str, Any]] = {}
    for key, fields in raters.items():
        try:
            uid = int(key)
        except (TypeError, ValueError):
            continue
        ids[uid] = fields
    known = set(db.session.scalars(db.select(User.id).where(User.id.in_(list(ids))))) if ids else set()
    now = utcnow()
    stored = 0
    for uid, fields in ids.items():
        if uid not in known:
            continue
        row = db.session.get(RaterAssessment, uid)
        if row is None:
            row = RaterAssessment(user_id=uid)
            db.session.add(row)
        status = str(fields.get("status") or "normal")[:16]
        checked = fields.get("checked")
        row.training_run_id = run_id
        row.events = int(_number(fields.get("events")) or 0)
        row.raw_share = _number(fields.get("raw_share"))
        row.share = _number(fields.get("share"))
        row.agreement = _number(fields.get("agreement"), None)
        row.checked = int(checked) if isinstance(checked, (int, float)) and math.isfinite(checked) else 0
        row.weight = _number(fields.get("weight"), 1.0)
        row.status = status
        row.reasons = [str(r) for r in (fields.get("reasons") or [])]
        row.assessed_at = now
        stored += 1
    db.session.commit()
    return stored


def excluded_raters() -> set[int]:
    """Users whose feedback and votes are counted out of A/B metrics: admins, users an admin
    quarantined, and users whose latest assessment is ``quarantined`` unless an admin set them
    ``trusted``."""
    admins = set(db.session.scalars(db.select(User.id).where(User.is_admin.is_(True))))
    trust = trust_settings()
    quarantined_by_admin = {uid for uid, t in trust.items() if t == "quarantined"}
    assessed = set(db.session.scalars(db.select(RaterAssessment.user_id)
                                      .where(RaterAssessment.status == "quarantined")))
    return admins | quarantined_by_admin | {uid for uid in assessed if trust.get(uid) != "trusted"}


def assessment_dict(row: RaterAssessment | None) -> dict[str, Any] | None:
    """An assessment as the admin API shows it (None: not assessed yet)."""
    if row is None:
        return None
    return {"training_run_id": row.training_run_id, "events": row.events, "raw_share": row.raw_share,
            "share": row.share, "agreement": row.agreement, "checked": row.checked, "weight": row.weight,
            "status": row.status, "reasons": list(row.reasons or []), "assessed_at": iso(row.assessed_at)}
