"""A correction: the answer as the rater would have it, at most a message's length (empty or null
clears it). Its answers count as rated (``corrections``)."""
from __future__ import annotations

from typing import Any

from flask import current_app

from webapp.core.ratings.kind import RatingKind
from webapp.core.validation import text_field


def parse(data: dict[str, Any]) -> str | None:
    return text_field(data, "correction", int(current_app.config["RLHF_MAX_MESSAGE_CHARS"]), required=False,
                      nullable=True)


CORRECTION = RatingKind("correction", parse, event="corrections")
