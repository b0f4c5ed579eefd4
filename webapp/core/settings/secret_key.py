"""The instance's cookie-signing key when no source sets one: generated once into
``<instance>/secret_key`` (mode 0600) and read back on every later start."""
from __future__ import annotations

import os
import secrets
from pathlib import Path


def secret_key(folder: Path) -> str:
    """The instance's secret key, generated once (0600) and reused on every start."""
    path = folder / "secret_key"
    if path.is_file():
        key = path.read_text().strip()
        if key:
            return key
    key = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key
