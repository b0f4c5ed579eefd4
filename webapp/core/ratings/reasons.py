"""Reason chips: a list of rlhf.data.criteria's ``REASONS`` (de-duplicated, order kept; null or []
clears them). The criteria heads learn from them; alone they do not make an answer rated."""
from __future__ import annotations

from typing import Any

from werkzeug.exceptions import BadRequest

from rlhf.data.criteria import REASONS
from webapp.core.ratings.kind import RatingKind
from webapp.core.validation import clip


def parse(data: dict[str, Any]) -> list[str]:
    reasons = data["reasons"]
    if reasons is None:
        reasons = []
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise BadRequest("'reasons' must be a list of strings.")
    unknown = [r for r in reasons if r not in REASONS]
    if unknown:
        raise BadRequest(f"Unknown reason(s): {', '.join(repr(clip(r)) for r in unknown[:5])}. "
                         f"Choose from: {', '.join(REASONS)}.")
    return list(dict.fromkeys(reasons))


def show(value: Any) -> list[str]:
    return list(value or ())


def record(value: Any) -> tuple[str, ...]:
    return tuple(value or ())


REASON_CHIPS = RatingKind("reasons", parse, empty=(), show=show, record=record)
