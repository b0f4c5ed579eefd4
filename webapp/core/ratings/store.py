"""Rating writes, the two upserts every writer uses (the chat page, the /v1 API, imports of other
front ends' ratings): a rater's one feedback row per answer, created or updated atomically, and
their one flag per answer, set in place or removed; and the stored ones read back as shown."""
from __future__ import annotations

import copy
from typing import Any

from flask import current_app
from sqlalchemy.exc import IntegrityError

from webapp.core.database import group_commit_writer
from webapp.core.extensions import db
from webapp.core.models import Feedback, Flag, iso, utcnow
from webapp.core.ratings.flag import flag_dict
from webapp.core.ratings.registry import FEEDBACK_FIELDS, FEEDBACK_KINDS, feedback_dict, shown

_FEEDBACK_ROW = db.select(Feedback).where(Feedback.user_id == db.bindparam("user_id"),
                                          Feedback.message_id == db.bindparam("message_id"))
_FLAG_ROW = db.select(Flag).where(Flag.user_id == db.bindparam("user_id"),
                                  Flag.message_id == db.bindparam("message_id"))

_UPSERTS: dict[tuple[str, tuple[str, ...]], Any] = {}

_RETURNED = (*FEEDBACK_FIELDS, "updated_at")
# what a new row holds for the kinds a rating leaves out, where that is not NULL (reasons: [])
_EMPTY = {kind.name: kind.empty for kind in FEEDBACK_KINDS if kind.empty is not None}


def _upsert_feedback(user_id: int, message_id: int, changes: dict[str, Any]) -> dict[str, Any] | None:
    """Apply ``changes`` to the caller's feedback row on a message, creating it if needed, in one
    ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING`` statement (SQLite, PostgreSQL): atomic
    against a simultaneous first rating of the same answer, and a fraction of the ORM's cost.
    Returns the stored feedback as :func:`feedback_dict`, or None on other databases."""
    dialect = db.session.get_bind().dialect.name
    if dialect not in ("sqlite", "postgresql"):
        return None
    keys = tuple(sorted(changes))
    stmt = _UPSERTS.get((dialect, keys))
    if stmt is None:  # one statement per dialect and set of changed fields, built once
        if dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        columns = ("user_id", "message_id", *_EMPTY, "created_at", "updated_at", *keys)
        table = Feedback.__table__  # the Core table: an ORM entity here would take the slower ORM bulk path
        ins = insert(table).values({c: db.bindparam(f"v_{c}", type_=table.c[c].type)
                                       for c in dict.fromkeys(columns)})
        stmt = _UPSERTS[(dialect, keys)] = ins.on_conflict_do_update(
            index_elements=["user_id", "message_id"],
            set_={c: ins.excluded[c] for c in (*keys, "updated_at")}
        ).returning(*(table.c[c] for c in _RETURNED))
    now = utcnow()
    params = {"v_user_id": user_id, "v_message_id": message_id, "v_created_at": now, "v_updated_at": now,
              **{f"v_{k}": v for k, v in _EMPTY.items()}, **{f"v_{k}": v for k, v in changes.items()}}
    writer = group_commit_writer(current_app)
    if writer is not None:  # SQLite: one writer at a time, so queued ratings share a transaction
        row = writer.execute_one(stmt, params)
    else:
        row = db.session.execute(stmt, params).one()
        db.session.commit()
    values = dict(zip(_RETURNED, row))
    return {**shown(values), "updated_at": iso(values["updated_at"])}


def save_feedback(user_id: int, message_id: int, changes: dict[str, Any]) -> dict[str, Any]:
    """Apply ``changes`` (validated: webapp.core.ratings.registry.feedback_changes) to the user's
    feedback on an answer; the stored feedback as :func:`feedback_dict` returns it."""
    body = _upsert_feedback(user_id, message_id, changes)
    if body is not None:
        return body
    for attempt in range(2):  # databases without INSERT ... ON CONFLICT: through the ORM
        fb = db.session.scalars(_FEEDBACK_ROW, {"user_id": user_id, "message_id": message_id}).first()
        if fb is None:
            fb = Feedback(user_id=user_id, message_id=message_id, **copy.deepcopy(_EMPTY))
            db.session.add(fb)
        for key, value in changes.items():
            setattr(fb, key, value)
        fb.updated_at = utcnow()
        body = feedback_dict(fb)  # before the commit expires it (reading it after costs a query)
        try:
            db.session.commit()
            break
        except IntegrityError:
            # A simultaneous request of the same user inserted the row first (unique per user and
            # message): apply this request's changes to that row instead.
            db.session.rollback()
            if attempt:
                raise
    return body  # type: ignore[return-value]


def stored_feedback(user_id: int, message_id: int) -> dict[str, Any] | None:
    """The user's feedback on an answer as :func:`feedback_dict` shows it (None: none)."""
    return feedback_dict(db.session.scalars(_FEEDBACK_ROW, {"user_id": user_id, "message_id": message_id}).first())


def save_flag(user_id: int, message_id: int, category: str, note: str | None) -> dict[str, Any]:
    """Set the user's flag on an answer (validated ``category`` and ``note``:
    webapp.core.ratings.flag.flag_fields), replacing the one they had; the stored flag as
    :func:`~webapp.core.ratings.flag.flag_dict` returns it."""
    for attempt in range(2):
        flag = db.session.scalars(_FLAG_ROW, {"user_id": user_id, "message_id": message_id}).first()
        now = utcnow()
        if flag is None:
            flag = Flag(user_id=user_id, message_id=message_id, created_at=now)
            db.session.add(flag)
        flag.category, flag.note, flag.updated_at = category, note, now
        body = flag_dict(flag)  # before the commit expires it
        try:
            db.session.commit()
            return body  # type: ignore[return-value]
        except IntegrityError:
            # A simultaneous request of the same user flagged the answer first (unique per user and
            # message): apply this request's flag to that row instead.
            db.session.rollback()
            if attempt:
                raise
    raise AssertionError("unreachable")


def remove_flag(user_id: int, message_id: int) -> bool:
    """Remove the user's flag on an answer; whether there was one."""
    result = db.session.execute(db.delete(Flag).where(Flag.user_id == user_id, Flag.message_id == message_id))
    db.session.commit()
    return bool(result.rowcount)


def stored_flag(user_id: int, message_id: int) -> dict[str, Any] | None:
    """The user's flag on an answer as :func:`~webapp.core.ratings.flag.flag_dict` shows it (None: none)."""
    return flag_dict(db.session.scalars(_FLAG_ROW, {"user_id": user_id, "message_id": message_id}).first())
