"""The flag: an answer reported as harmful in one of rlhf.data.criteria's ``FLAG_CATEGORIES``, with an
optional note. The one kind with a row of its own (a rater's flag is replaced in place or removed,
never merged into the feedback row); a flag alone makes an answer rated (``flags``), and the
safety criterion learns from it."""
from __future__ import annotations

from typing import Any

from werkzeug.exceptions import BadRequest

from rlhf.data.criteria import FLAG_CATEGORIES, FLAG_NOTE_MAX_CHARS, FLAG_VALUES
from webapp.core.models import Flag, iso
from webapp.core.validation import clip, text_field

FLAG = "flag"  # its key beside the feedback fields where one request carries both (POST /v1/feedback)
FLAG_FIELDS = ("category", "note")
FLAG_LABELS: dict[str, str] = dict(FLAG_CATEGORIES)


def flag_fields(data: dict[str, Any]) -> tuple[str, str | None]:
    """A flag's validated ``(category, note)``: ``category`` one of ``FLAG_VALUES`` (required),
    ``note`` optional text of at most ``FLAG_NOTE_MAX_CHARS`` (empty or null: none)."""
    category = data.get("category")
    if category is None:
        raise BadRequest(f"'category' is required: one of {', '.join(FLAG_VALUES)}.")
    if not isinstance(category, str) or category not in FLAG_VALUES:
        shown = repr(clip(category)) if isinstance(category, str) else "not a string"
        raise BadRequest(f"Unknown flag category ({shown}). Choose from: "
                         f"{', '.join(f'{value} ({label})' for value, label in FLAG_CATEGORIES)}.")
    note = text_field(data, "note", FLAG_NOTE_MAX_CHARS, required=False, nullable=True)
    return category, note


def flag_dict(flag: Flag | None) -> dict[str, Any] | None:
    """A rater's flag on an answer as the APIs show it (None: not flagged)."""
    if flag is None:
        return None
    return {"category": flag.category, "label": FLAG_LABELS.get(flag.category, flag.category), "note": flag.note,
            "created_at": iso(flag.created_at), "updated_at": iso(flag.updated_at)}
