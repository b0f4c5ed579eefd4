"""Flag writes: the caller's one flag per answer (a harm category of rlhf.data.criteria and an optional
note), created or changed in place, or removed."""
from __future__ import annotations

from typing import Any

from sqlalchemy.exc import IntegrityError

from webapp.chat.conversations import flag_dict
from webapp.core.extensions import db
from webapp.core.models import Flag, utcnow

_FLAG_ROW = db.select(Flag).where(Flag.user_id == db.bindparam("user_id"), Flag.message_id == db.bindparam("message_id"))


def save_flag(user_id: int, message_id: int, category: str, note: str | None) -> dict[str, Any]:
    """Set the user's flag on an answer (validated ``category`` and ``note``), replacing the one
    they had; the stored flag as :func:`~webapp.chat.conversations.flag_dict` returns it."""
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
