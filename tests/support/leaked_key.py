"""The secret key that was once committed to this repository (webapp/instance/secret_key), read
from git history so that no tracked file holds it; tests that need it skip where the history is
not there (a shallow clone, no git)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.paths import ROOT

LEAKED_PATH = "webapp/instance/secret_key"


def leaked_secret_key() -> str:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    added = subprocess.run(["git", "log", "--all", "--diff-filter=A", "--format=%H", "--", LEAKED_PATH],
                           cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not added:
        pytest.skip(f"{LEAKED_PATH} is not in this clone's history")
    shown = subprocess.run(["git", "show", f"{added[-1]}:{LEAKED_PATH}"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode != 0 or not shown.stdout.strip():
        pytest.skip(f"{LEAKED_PATH} cannot be read from history")
    return shown.stdout.strip()
