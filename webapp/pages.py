"""Server-rendered pages for end users."""
from __future__ import annotations

from flask import Blueprint, current_app, render_template

bp = Blueprint("pages", __name__)


@bp.get("/")
def index():
    return render_template("chat.html", max_chars=current_app.config["RLHF_MAX_MESSAGE_CHARS"])
