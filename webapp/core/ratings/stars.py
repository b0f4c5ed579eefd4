"""Stars: an integer from 1 to 5 (null clears it), stored as ``rating``. Its answers count as
rated (``ratings``)."""
from __future__ import annotations

from typing import Any

from werkzeug.exceptions import BadRequest

from webapp.core.ratings.kind import RatingKind

STARS = range(1, 6)  # the schema's check constraint (webapp.core.models): rating BETWEEN 1 AND 5


def parse(data: dict[str, Any]) -> int | None:
    value = data["rating"]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value not in STARS):
        raise BadRequest(f"'rating' must be an integer from {STARS[0]} to {STARS[-1]}, or null.")
    return value


RATING = RatingKind("rating", parse, event="ratings")
