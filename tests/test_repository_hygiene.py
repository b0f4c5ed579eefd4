"""Nothing runtime is tracked in git: no database, secret key, lock, model weights or instance
folder. A secret key in a repository is a finding in any review; these checks fail the suite the
moment one is added again (``git add -f`` included)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What an instance folder holds at runtime (webapp.core.settings, rlhf.registry, the scheduler).
RUNTIME_PATTERNS = [
    r"(^|/)instance/(?!config\.example\.py$|\.gitkeep$)",  # any instance folder's contents
    r"\.db(-wal|-shm|-journal)?$", r"\.sqlite3?$",
    r"(^|/)secret_key$", r"\.lock$",
    r"\.safetensors$", r"\.bin$", r"\.pt$", r"\.ckpt$",
]
# A private key or a long random token pasted into a tracked text file.
SECRET_PATTERNS = [r"-----BEGIN [A-Z ]*PRIVATE KEY-----", r"\bSECRET_KEY\s*=\s*['\"][0-9a-f]{32,}['\"]"]


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def runtime_state(paths: list[str]) -> list[str]:
    return [p for p in paths if any(re.search(pattern, p) for pattern in RUNTIME_PATTERNS)]


def test_patterns_catch_what_an_instance_folder_holds():
    # the check itself must be able to fail: every kind of runtime file is caught, source is not
    caught = runtime_state(["webapp/instance/secret_key", "instance/rlhf.db", "x/rlhf.db-wal",
                            "instance/models/v1-base/model.safetensors", "instance/scheduler.lock",
                            "instance/config.py"])
    assert len(caught) == 6
    assert runtime_state(["instance/config.example.py", "webapp/core/settings/sources.py", "README.md"]) == []


def test_no_runtime_state_is_tracked():
    assert runtime_state(tracked_files()) == []


def test_no_secret_in_tracked_text():
    found = []
    for path in tracked_files():
        file = ROOT / path
        if not file.is_file() or file.stat().st_size > 2_000_000:
            continue
        try:
            text = file.read_text()
        except UnicodeDecodeError:
            continue
        found += [path for pattern in SECRET_PATTERNS if re.search(pattern, text)]
    assert found == []


def test_instance_folders_are_ignored():
    if shutil.which("git") is None:
        pytest.skip("git missing")
    probes = ["webapp/instance/secret_key", "instance/secret_key", "instance/rlhf.db", "tmp/instance/models/x"]
    result = subprocess.run(["git", "check-ignore", *probes], cwd=ROOT, capture_output=True, text=True)
    assert sorted(result.stdout.split()) == sorted(probes)
    kept = subprocess.run(["git", "check-ignore", "instance/config.example.py"], cwd=ROOT, capture_output=True)
    assert kept.returncode == 1  # the example config stays tracked
