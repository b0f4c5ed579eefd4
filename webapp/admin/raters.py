"""The admin raters page's filtered, sorted, paged query; the admin's trust decisions; the
"Rater trust" section of a training run.

A rater is a non-admin user with feedback events, an assessment (webapp/core/raters.py) or a
trust setting. Per rater: who (username or "anonymous #id"), signed in, account age, feedback
events (all time, by the one definition of webapp/training/records.py), the latest training
run's assessment (share of the cycle's signal, agreement, weight, status, reasons), the admin's
setting and whether their feedback is counted out of A/B verdicts.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

from flask_login import current_user
from werkzeug.exceptions import BadRequest, NotFound

from rlhf.trust.vocabulary import RATER_STATUSES, TRUST_LEVELS
from webapp.core.audit import audit
from webapp.core.extensions import db
from webapp.core.models import IdentityOrigin, RaterAssessment, RaterTrust, User, iso, utcnow
from webapp.core.raters import assessment_dict, set_trust
from webapp.core.validation import clip, json_body, text_field
from webapp.training.records import events_per_user

PER_PAGE = 50
RATER_FILTERS = {"status", "trust", "q", "min_events", "sort", "order", "page"}
STATUS_FILTERS = RATER_STATUSES + ("unassessed",)
SORTS = ("events", "share", "agreement", "weight", "status", "assessed", "age", "id")
MAX_NOTE_CHARS = 500


def _positive_int(value: str, name: str, low: int = 1) -> int:
    # ASCII digits only ("²".isdigit() is true), few enough that the number fits the database
    if not (value.isascii() and value.isdigit() and len(value) <= 9) or int(value) < low:
        raise BadRequest(f"{name} must be a whole number from {low} to 999999999.")
    return int(value)


def display_name(user_id: int, username: str | None) -> str:
    return username or f"anonymous #{user_id}"


def _excluded(trust: str, status: str | None) -> bool:
    return trust == "quarantined" or (status == "quarantined" and trust != "trusted")


def _finite(value: float | None) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def rater_page(args: Mapping[str, str]) -> dict[str, Any]:
    """Raters filtered (``status``: an assessment status or ``unassessed``; ``trust``: the admin's
    setting; ``q``: username or id; ``min_events``), sorted (``sort`` by events, share, agreement,
    weight, status, assessed, age or id; ``order`` asc/desc) and paged (50 per page)."""
    unknown = set(args) - RATER_FILTERS
    if unknown:
        raise BadRequest(f"Unknown filter(s): {', '.join(clip(k) for k in sorted(unknown)[:10])}. "
                         f"Allowed: {', '.join(sorted(RATER_FILTERS))}.")
    events = events_per_user()
    n_events = db.func.coalesce(events.c.events, 0)
    trust_col = db.func.coalesce(RaterTrust.trust, "auto")
    q = (db.select(User, n_events.label("events"), RaterAssessment, RaterTrust)
         .outerjoin(events, events.c.uid == User.id)
         .outerjoin(RaterAssessment, RaterAssessment.user_id == User.id)
         .outerjoin(RaterTrust, RaterTrust.user_id == User.id)
         .where(User.is_admin.is_(False))
         .where(db.or_(events.c.uid.is_not(None), RaterAssessment.user_id.is_not(None),
                       RaterTrust.user_id.is_not(None))))
    status = args.get("status") or ""
    if status:
        if status not in STATUS_FILTERS:
            raise BadRequest(f"status must be one of {', '.join(STATUS_FILTERS)}.")
        q = q.where(RaterAssessment.user_id.is_(None) if status == "unassessed" else RaterAssessment.status == status)
    trust = args.get("trust") or ""
    if trust:
        if trust not in TRUST_LEVELS:
            raise BadRequest(f"trust must be one of {', '.join(TRUST_LEVELS)}.")
        q = q.where(trust_col == trust)
    text = (args.get("q") or "").strip()
    if text:
        if "\x00" in text:
            raise BadRequest("q must not contain NUL characters.")
        number = re.fullmatch(r"(?:anonymous\s*)?#?\s*(\d{1,18})", text, re.IGNORECASE)
        like = f"%{text[:80]}%"
        q = q.where(db.or_(User.id == int(number.group(1)), User.username.ilike(like)) if number
                    else User.username.ilike(like))
    if args.get("min_events"):
        q = q.where(n_events >= _positive_int(args["min_events"], "min_events", low=0))
    sort = args.get("sort") or "events"
    if sort not in SORTS:
        raise BadRequest(f"sort must be one of {', '.join(SORTS)}.")
    order = args.get("order") or ("asc" if sort in ("id", "age") else "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("order must be asc or desc.")
    if sort == "age":  # "desc": the oldest accounts (the largest age) first
        q = q.order_by(User.created_at.asc() if order == "desc" else User.created_at.desc(), User.id)
    else:
        column = {"events": n_events, "share": RaterAssessment.share, "agreement": RaterAssessment.agreement,
                  "weight": RaterAssessment.weight, "status": RaterAssessment.status,
                  "assessed": RaterAssessment.assessed_at, "id": User.id}[sort]
        q = q.order_by((column.asc() if order == "asc" else column.desc()).nulls_last(), User.id)
    page_n = _positive_int(args.get("page") or "1", "page")
    total = int(db.session.scalar(db.select(db.func.count()).select_from(q.order_by(None).subquery())) or 0)
    rows = db.session.execute(q.limit(PER_PAGE).offset((page_n - 1) * PER_PAGE)).all()
    items = _items(rows)
    latest = db.session.scalar(db.select(db.func.max(RaterAssessment.training_run_id)))
    assessed = int(db.session.scalar(db.select(db.func.count()).select_from(RaterAssessment)) or 0)
    return {"items": items, "total": total, "page": page_n, "pages": max(1, -(-total // PER_PAGE)),
            "sort": sort, "order": order, "latest_run_id": latest, "assessed": assessed}


def _items(rows) -> list[dict[str, Any]]:
    now = utcnow()
    ids = [user.id for user, *_ in rows]
    setters = {}
    set_by = {t.set_by for *_, t in rows if t is not None and t.set_by}
    if set_by:
        setters = dict(db.session.execute(db.select(User.id, User.username).where(User.id.in_(set_by))).all())
    origin = dict(db.session.execute(db.select(IdentityOrigin.user_id, IdentityOrigin.address_hash)
                                     .where(IdentityOrigin.user_id.in_(ids))).all()) if ids else {}
    same: dict[str, int] = {}
    if origin:
        same = dict(db.session.execute(db.select(IdentityOrigin.address_hash, db.func.count())
                                       .where(IdentityOrigin.address_hash.in_(set(origin.values())))
                                       .group_by(IdentityOrigin.address_hash)).all())
    items = []
    for user, n_events, assessment, trust_row in rows:
        trust = trust_row.trust if trust_row is not None else "auto"
        status = assessment.status if assessment is not None else None
        item = {"user_id": user.id, "username": user.username, "name": display_name(user.id, user.username),
                "signed_in": bool(user.password_hash), "created_at": iso(user.created_at),
                "account_age_hours": round(max(0.0, (now - user.created_at).total_seconds() / 3600), 2)
                if user.created_at else None,
                "events": int(n_events or 0), "assessment": assessment_dict(assessment), "trust": trust,
                "trust_note": trust_row.note if trust_row is not None else None,
                "trust_set_by": setters.get(trust_row.set_by) if trust_row is not None else None,
                "trust_set_at": iso(trust_row.set_at) if trust_row is not None else None,
                "excluded": _excluded(trust, status),
                "same_address": max(0, same.get(origin.get(user.id, ""), 1) - 1) if user.id in origin else None}
        if item["assessment"]:
            for key in ("raw_share", "share", "agreement", "weight"):
                item["assessment"][key] = _finite(item["assessment"][key])
        items.append(item)
    return items


def rater_or_404(user_id: int) -> dict[str, Any]:
    """One rater as the list shows them (any non-admin user, with or without feedback)."""
    user = db.session.get(User, user_id)
    if user is None:
        raise NotFound("User not found.")
    rows = db.session.execute(
        db.select(User, db.literal(0), RaterAssessment, RaterTrust)
        .outerjoin(RaterAssessment, RaterAssessment.user_id == User.id)
        .outerjoin(RaterTrust, RaterTrust.user_id == User.id).where(User.id == user_id)).all()
    item = _items(rows)[0]
    events = events_per_user()
    item["events"] = int(db.session.scalar(db.select(events.c.events).where(events.c.uid == user_id)) or 0)
    return item


def change_trust(user_id: int) -> dict[str, Any]:
    """``POST /api/admin/raters/<id>/trust`` with ``{"trust", "note"?}``: the admin's setting,
    audit-logged with the old and the new value. 404 for an unknown user, 400 for an admin or a
    bad body."""
    data = json_body({"trust", "note"})
    trust = data.get("trust")
    if trust not in TRUST_LEVELS:
        raise BadRequest(f"'trust' must be one of: {', '.join(TRUST_LEVELS)}.")
    note = text_field(data, "note", MAX_NOTE_CHARS, required=False, nullable=True)
    user = db.session.get(User, user_id)
    if user is None:
        raise NotFound("User not found.")
    if user.is_admin:
        raise BadRequest("Admins are always counted out of A/B verdicts; their trust cannot be set.")
    old, _ = set_trust(user_id, trust, note, current_user.id)
    audit("rater_trust", display_name(user.id, user.username), user_id=user.id, old=old, new=trust, note=note)
    db.session.commit()
    return rater_or_404(user_id)


# ---------------------------------------------------------------------------- a run's "Rater trust" section

RULE_LABELS = {"quarantined": "Quarantined raters (left out)", "capped": "Volume cap (share of the signal)",
               "down_weighted": "Down-weighted (low agreement with other raters)",
               "new": "New raters (little history)"}


def _count(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def trust_section(feedback_counts: Any) -> dict[str, Any] | None:
    """The run's ``feedback_counts["trust"]`` (rlhf.trust's summary: ``rules`` {rule: {raters,
    rows, weight_removed}}, ``applied`` {rule: bool}, ``notes`` [str]) as the run page shows it:
    one row per rule (the known ones first, in their order), and the notes. None without it."""
    trust = feedback_counts.get("trust") if isinstance(feedback_counts, dict) else None
    if not isinstance(trust, dict):
        return None
    rules = trust.get("rules") if isinstance(trust.get("rules"), dict) else {}
    applied = trust.get("applied") if isinstance(trust.get("applied"), dict) else {}
    names = [r for r in RULE_LABELS if r in rules or r in applied]
    names += sorted(str(r) for r in set(rules) | set(applied) if r not in RULE_LABELS)
    rows = []
    for name in names:
        figures = rules.get(name) if isinstance(rules.get(name), dict) else {}
        flag = applied.get(name)
        rows.append({"rule": name, "label": RULE_LABELS.get(name, name.replace("_", " ")),
                     "applied": flag if isinstance(flag, bool) else None,
                     "raters": _count(figures.get("raters")), "rows": _count(figures.get("rows")),
                     "weight_removed": _count(figures.get("weight_removed"))})
    notes = trust.get("notes")
    notes = [str(n) for n in notes] if isinstance(notes, list) else ([str(notes)] if notes else [])
    return {"rows": rows, "notes": notes}
