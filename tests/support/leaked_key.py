"""The secret key that was once committed to this repository (webapp/instance/secret_key,
untracked since): public ever since, so no longer a secret but a known-bad value that
every instance refuses (webapp/core/settings/secret_key.py keeps only its SHA-256). The tests keep
the value itself, so that they run the same in any checkout, with or without git history."""
from __future__ import annotations

import hashlib

# published in this repository's history: a test vector, signing nothing anywhere
PUBLISHED_KEY = "29d1036261ab96c2addccd6622db9dbab090d937655e192eee808e1ea4a2fb18"
assert hashlib.sha256(PUBLISHED_KEY.encode()).hexdigest() == \
    "81ab4d2dd024df541baa6b8fff66519579bce1cdbf4561ebfca1414a824bc9ed"


def leaked_secret_key() -> str:
    return PUBLISHED_KEY
