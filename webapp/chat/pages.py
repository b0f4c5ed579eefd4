"""Server-rendered pages for end users."""
from __future__ import annotations

from flask import Blueprint, current_app, render_template

from rlhf.data.criteria import FLAG_CATEGORIES, FLAG_NOTE_MAX_CHARS, REASONS_DOWN, REASONS_UP

bp = Blueprint("pages", __name__)


@bp.get("/")
def index():
    return render_template("chat.html", max_chars=current_app.config["RLHF_MAX_MESSAGE_CHARS"],
                           reasons_up=list(REASONS_UP), reasons_down=list(REASONS_DOWN),
                           flag_categories=FLAG_CATEGORIES, flag_note_max=FLAG_NOTE_MAX_CHARS)
