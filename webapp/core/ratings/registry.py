"""The rating kinds in use, and everything that walks them: the request's fields checked (the chat
page, /v1 and the importers alike), the stored feedback as the APIs and the feedback browser show
it, and as training records (and so the exports) carry it.

A new kind of the feedback row is one module defining its :class:`~webapp.core.ratings.kind.RatingKind`
and one line in :data:`FEEDBACK_KINDS` (docs/development.md, "Adding a rating kind"). The flag,
with a row of its own, is webapp.core.ratings.flag.
"""
from __future__ import annotations

from typing import Any, Mapping

from werkzeug.exceptions import BadRequest

from webapp.core.models import Feedback, iso
from webapp.core.ratings.comment import COMMENT
from webapp.core.ratings.correction import CORRECTION
from webapp.core.ratings.kind import RatingKind
from webapp.core.ratings.reasons import REASON_CHIPS
from webapp.core.ratings.stars import RATING
from webapp.core.ratings.thumb import THUMB

# The kinds of the feedback row, in the order the APIs list them.
FEEDBACK_KINDS: tuple[RatingKind, ...] = (
    THUMB,
    RATING,
    CORRECTION,
    COMMENT,
    REASON_CHIPS,
)
FEEDBACK_FIELDS: tuple[str, ...] = tuple(kind.name for kind in FEEDBACK_KINDS)
KINDS: dict[str, RatingKind] = {kind.name: kind for kind in FEEDBACK_KINDS}


def feedback_changes(data: Mapping[str, Any]) -> dict[str, Any]:
    """The validated values of the kinds ``data`` sets (those absent stay as they were); a
    BadRequest says what is wrong. Unknown keys are the caller's to refuse (its body has others)."""
    if not any(name in data for name in FEEDBACK_FIELDS):
        raise BadRequest(f"Send at least one of: {', '.join(FEEDBACK_FIELDS)}.")
    return {kind.name: kind.parse(data) for kind in FEEDBACK_KINDS if kind.name in data}


def shown(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Each kind's stored value (``values``: a row's, by name; None: no row) as the APIs show it."""
    return {kind.name: kind.show(values.get(kind.name) if values is not None else kind.empty)
            for kind in FEEDBACK_KINDS}


def feedback_dict(fb: Feedback | None) -> dict[str, Any] | None:
    """A rater's feedback row as the APIs show it: each kind, and when it last changed (None: no row)."""
    if fb is None:
        return None
    return {**shown(row_values(fb)), "updated_at": iso(fb.updated_at)}


def row_values(row: Any) -> dict[str, Any]:
    """A feedback row's (or any object's with the kinds as attributes) stored values, by name."""
    return {name: getattr(row, name) for name in FEEDBACK_FIELDS}


def unchanged(row: Any, changes: Mapping[str, Any]) -> bool:
    """Whether storing ``changes`` would leave ``row`` showing what it shows now."""
    return all(KINDS[name].show(getattr(row, name)) == KINDS[name].show(value) for name, value in changes.items())


def record_fields(row: Any) -> dict[str, Any]:
    """A feedback row's values as rlhf.data.records.FeedbackRecord takes them (its fields of the same name)."""
    return {kind.name: kind.record(getattr(row, kind.name)) for kind in FEEDBACK_KINDS if kind.record is not None}


def event_kinds() -> dict[str, str]:
    """Event name -> kind name, for the kinds that make an answer rated (feedback events)."""
    return {kind.event: kind.name for kind in FEEDBACK_KINDS if kind.event}
