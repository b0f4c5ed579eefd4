"""The whole repository passes ruff ([tool.ruff] in pyproject.toml: pycodestyle errors and warnings,
pyflakes, import order; lines up to 120 characters). ruff is a dev dependency: without it this test
fails rather than skips."""
from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"ruff check (exit code {result.returncode}):\n{result.stdout}{result.stderr}"
