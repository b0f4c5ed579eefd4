"""A comment: free text beside the other ratings (empty or null clears it); alone it does not make
an answer rated."""
from __future__ import annotations

from typing import Any

from webapp.core.ratings.kind import RatingKind
from webapp.core.validation import text_field

MAX_COMMENT_CHARS = 2000


def parse(data: dict[str, Any]) -> str | None:
    return text_field(data, "comment", MAX_COMMENT_CHARS, required=False, nullable=True)


COMMENT = RatingKind("comment", parse)
