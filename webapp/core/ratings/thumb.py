"""The thumb: up or down (null clears it). Its answers count as rated (``thumbs``)."""
from __future__ import annotations

from typing import Any

from werkzeug.exceptions import BadRequest

from webapp.core.ratings.kind import RatingKind

THUMBS = ("up", "down")  # the schema's check constraint (webapp.core.models) is built from these too
_ALLOWED = ", ".join(f'"{t}"' for t in THUMBS) + " or null"


def parse(data: dict[str, Any]) -> str | None:
    value = data["thumb"]
    if value is not None and (not isinstance(value, str) or value not in THUMBS):
        raise BadRequest(f"'thumb' must be {_ALLOWED}.")
    return value


THUMB = RatingKind("thumb", parse, event="thumbs")
