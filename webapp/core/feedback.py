"""Feedback writes: a user's one feedback row per answer, created or updated atomically. The one
upsert every writer uses: the chat API, the /v1 API and imports of other front ends' ratings."""
from __future__ import annotations

from typing import Any

from flask import current_app
from sqlalchemy.exc import IntegrityError

from webapp.core.database import group_commit_writer
from webapp.core.extensions import db
from webapp.core.models import Feedback, iso, utcnow


def feedback_dict(fb: Feedback | None) -> dict[str, Any] | None:
    """A feedback row as the APIs show it."""
    if fb is None:
        return None
    return {"thumb": fb.thumb, "rating": fb.rating, "correction": fb.correction, "comment": fb.comment,
            "reasons": fb.reasons or [], "updated_at": iso(fb.updated_at)}


_FEEDBACK_ROW = db.select(Feedback).where(Feedback.user_id == db.bindparam("user_id"),
                                          Feedback.message_id == db.bindparam("message_id"))


_UPSERTS: dict[tuple[str, tuple[str, ...]], Any] = {}


_RETURNED = ("thumb", "rating", "correction", "comment", "reasons", "updated_at")


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
        columns = ("user_id", "message_id", "reasons", "created_at", "updated_at", *keys)
        table = Feedback.__table__  # the Core table: an ORM entity here would take the slower ORM bulk path
        ins = insert(table).values({c: db.bindparam(f"v_{c}", type_=table.c[c].type)
                                       for c in dict.fromkeys(columns)})
        stmt = _UPSERTS[(dialect, keys)] = ins.on_conflict_do_update(
            index_elements=["user_id", "message_id"],
            set_={c: ins.excluded[c] for c in (*keys, "updated_at")}
        ).returning(*(table.c[c] for c in _RETURNED))
    now = utcnow()
    params = {"v_user_id": user_id, "v_message_id": message_id, "v_reasons": [], "v_created_at": now,
              "v_updated_at": now, **{f"v_{k}": v for k, v in changes.items()}}
    writer = group_commit_writer(current_app)
    if writer is not None:  # SQLite: one writer at a time, so queued ratings share a transaction
        row = writer.execute_one(stmt, params)
    else:
        row = db.session.execute(stmt, params).one()
        db.session.commit()
    fb = dict(zip(_RETURNED, row))
    return {"thumb": fb["thumb"], "rating": fb["rating"], "correction": fb["correction"], "comment": fb["comment"],
            "reasons": fb["reasons"] or [], "updated_at": iso(fb["updated_at"])}


def save_feedback(user_id: int, message_id: int, changes: dict[str, Any]) -> dict[str, Any]:
    """Apply ``changes`` (validated) to the user's feedback on an answer; the stored feedback as
    :func:`feedback_dict` returns it."""
    body = _upsert_feedback(user_id, message_id, changes)
    if body is not None:
        return body
    for attempt in range(2):  # databases without INSERT ... ON CONFLICT: through the ORM
        fb = db.session.scalars(_FEEDBACK_ROW, {"user_id": user_id, "message_id": message_id}).first()
        if fb is None:
            fb = Feedback(user_id=user_id, message_id=message_id, reasons=[])
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
    return body
