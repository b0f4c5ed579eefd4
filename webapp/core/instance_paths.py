"""Filesystem paths as the database stores them (model versions, reward models): relative to the
instance folder, in POSIX form, when they lie inside it, so the folder can be moved, restored on
another host or mounted at another path without changing a row; anything else (a model directory
elsewhere, a hub id) as given. Every write goes through :func:`to_stored`, every read through
:func:`resolve`.

Rows written before paths were stored this way hold absolute paths. One that exists is used as
is; one that does not but points into an instance subfolder (``<old instance>/models/v3-ppo``,
``<old instance>/runs/run-2/reward_model``) is looked for in this instance's same subfolder, so an
instance moved with such rows still finds its files.
"""
from __future__ import annotations

import os
from pathlib import Path

from flask import current_app

# The instance's subfolders that stored paths point into (the model store's own, if configured
# elsewhere inside the instance, is added by _subfolders).
SUBFOLDERS = ("models", "runs")


def instance_folder() -> Path:
    """The running app's instance folder (RLHF_INSTANCE_DIR)."""
    return Path(current_app.config["INSTANCE_DIR"])


def relative_inside(path: Path, folder: Path) -> str | None:
    """``path`` relative to ``folder`` (as given or resolved) in POSIX form, or None when outside it."""
    for base in dict.fromkeys((folder, folder.resolve())):
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            continue
    return None


def to_stored(path: str | os.PathLike[str]) -> str:
    """``path`` as a row stores it: relative to the instance folder when inside it, else as given
    (an absolute path elsewhere, or a relative name such as a hub id)."""
    raw = Path(path)
    if not raw.is_absolute():
        return os.fspath(path)
    instance = instance_folder()
    normal = Path(os.path.normpath(raw))
    for candidate in (normal, Path(os.path.realpath(normal))):
        rel = relative_inside(candidate, instance)
        if rel is not None:
            return rel
    return os.fspath(path)


def _subfolders(instance: Path) -> set[str]:
    names = set(SUBFOLDERS)
    store = current_app.config.get("MODEL_STORE")
    rel = relative_inside(Path(os.path.normpath(store)), instance) if store else None
    if rel and rel != ".":
        names.add(rel.split("/")[0])
    return names


def resolve(stored: str | os.PathLike[str]) -> Path:
    """Where a stored path is on this host: relative ones inside the instance folder; an absolute
    one as is when it exists, else, when it points into an instance subfolder of another
    (moved) instance folder and the same file is in this one, that file."""
    path = Path(stored)
    instance = instance_folder()
    if not path.is_absolute():
        return instance / path
    if path.exists():
        return path
    names = _subfolders(instance)
    parts = path.parts
    for i in range(len(parts) - 1, 0, -1):  # the innermost match first
        if parts[i] in names:
            moved = instance.joinpath(*parts[i:])
            if moved.exists():
                return moved
    return path
