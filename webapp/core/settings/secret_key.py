"""The instance's cookie-signing key when no source sets one: generated once into
``<instance>/secret_key`` (mode 0600) and read back on every later start.

A key that has been published signs anyone's cookies: :func:`is_published` knows the SHA-256 of
each such key (only the digest is kept here, never the key), and no instance starts with one
(webapp/core/settings/sources.py), nor does a restore install one (webapp/core/backup_manifest.py).
"""
from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

from webapp.core.private_files import write_private

# SHA-256 (hex) of the keys that were published: the instance key once committed to this
# repository as webapp/instance/secret_key, still readable in its git history.
PUBLISHED_KEY_SHA256 = frozenset({"81ab4d2dd024df541baa6b8fff66519579bce1cdbf4561ebfca1414a824bc9ed"})


def is_published(key: str) -> bool:
    """Whether ``key`` (as given, or without surrounding whitespace) is a published key."""
    return any(hashlib.sha256(k.encode()).hexdigest() in PUBLISHED_KEY_SHA256 for k in {key, key.strip()})


def secret_key(folder: Path) -> str:
    """The instance's secret key, generated once (0600) and reused on every start."""
    path = folder / "secret_key"
    if path.is_file():
        key = path.read_text().strip()
        if key:
            return key
    key = secrets.token_hex(32)
    write_private(path, key)
    return key
