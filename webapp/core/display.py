"""Paths and text as the dashboard shows them: relative to the instance folder (or the model
store), so the API and pages never reveal where the instance lives on disk; URLs without the
credentials they may carry."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from flask import current_app

from webapp.core.instance_paths import relative_inside, resolve


def display_path(path: str | None) -> str | None:
    """``path`` as the dashboard shows it: relative to the instance folder (or to the model
    store when that lies elsewhere); other paths unchanged. An absolute row of an instance that
    was moved shows where its files are now (webapp.core.instance_paths.resolve)."""
    if not path:
        return path
    p = Path(path)
    if not p.is_absolute():
        return path
    p = resolve(p)
    cfg = current_app.config
    for root in (cfg.get("INSTANCE_DIR"), cfg.get("MODEL_STORE")):
        rel = relative_inside(p, Path(root)) if root else None
        if rel is not None:
            return rel
    return path


def display_paths(value: Any) -> Any:
    """A copy of ``value`` (JSON-like) with every absolute path under the instance folder or the
    model store made relative (:func:`display_path`); for API answers meant for display."""
    if isinstance(value, dict):
        return {k: display_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [display_paths(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        return display_path(value)
    return value


def display_text(text: str | None) -> str | None:
    """Free text (a run's log) with the instance folder's and model store's prefixes removed."""
    if not text:
        return text
    cfg = current_app.config
    for root in (cfg.get("INSTANCE_DIR"), cfg.get("MODEL_STORE")):
        if root:
            for base in {str(Path(root)), str(Path(root).resolve())}:
                text = text.replace(base.rstrip("/") + "/", "")
    return text


MASK = "***"
_TOKEN_NAME = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session", re.I)


def mask_url(value: str) -> str:
    """``value`` with a URL's user and password (``https://user:pass@host``: both, since a token is
    often sent as the user alone) and the values of its token-like query parameters (``?token=``,
    ``api_key=``, ...) replaced by ``***``; anything else unchanged."""
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if not parts.scheme or not parts.netloc:
        return value
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    pieces = []
    for piece in parts.query.split("&") if parts.query else []:
        name, eq, given = piece.partition("=")
        pieces.append(f"{name}={MASK}" if eq and given and _TOKEN_NAME.search(unquote(name)) else piece)
    query = "&".join(pieces)
    if (netloc, query) == (parts.netloc, parts.query):
        return value
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
