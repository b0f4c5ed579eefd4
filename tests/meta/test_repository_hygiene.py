"""Nothing runtime is tracked in git: no database, secret key, lock, model weights or instance
folder. A secret key in a repository is a finding in any review; these checks fail the suite the
moment one is added again (``git add -f`` included)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support.history import commits, work_items
from tests.support.paths import ROOT  # noqa: E402

# What an instance folder holds at runtime (webapp.core.settings, rlhf.models.registry, the scheduler).
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


# ---------------------------------------------------------------------------- comments say what is
# Source and documentation describe the code as it is; the history of how it got there belongs in
# CHANGELOG.md and git. A work item ("issue", "round" or "session" and its number) or a commit hash
# in a comment means nothing to a reader of the tree and goes stale when the code moves.
HISTORY_SUFFIXES = (".py", ".js", ".html", ".md")
HISTORY_EXEMPT = ("CHANGELOG.md",  # history by design
                  "tests/meta/test_docs.py",  # its self-tests plant the phrases its own check must catch
                  "tests/support/history.py")  # the patterns, with examples of what they catch
THIRD_PARTY = ("static/vendor/",)  # vendored as published, not ours to edit
JS_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
HTML_COMMENT = re.compile(r"<!--.*?-->|\{#.*?#\}", re.S)


def python_comments(text: str) -> list[str]:
    """The comments and docstrings of a Python source."""
    import ast
    import io
    import tokenize

    out = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(ast.get_docstring(node, clean=False) or "")
    return out


def comments(path: str, text: str) -> list[str]:
    if path.endswith(".py"):
        return python_comments(text)
    if path.endswith(".js"):
        return JS_COMMENT.findall(text)
    return HTML_COMMENT.findall(text)  # .html, and the comments of .md files


def history_references(path: str, text: str) -> list[str]:
    """``path: phrase`` for each work-item phrase anywhere in the file and each commit-like token in
    one of its comments."""
    found = work_items(text)
    found += [sha for c in comments(path, text) for sha in commits(c)]
    return [f"{path}: {phrase}" for phrase in found]


def test_history_check_catches_work_items_and_commits():
    # the check itself must be able to fail, and must leave ordinary text alone (the examples are
    # built with f-strings so that this file does not contain what it looks for)
    n, sha = 17, "ab1f2c3"
    assert history_references("a.py", f'"""The output rail (issue {n})."""\n') == [f"a.py: issue {n}"]
    assert history_references("a.py", f"x = 1  # as in {sha}\n") == [f"a.py: {sha}"]
    assert history_references("a.js", f"/* fixed in Round {n} */ let x;\n// see commit {sha}d\n") == \
        [f"a.js: Round {n}", f"a.js: {sha}d"]
    assert history_references("a.html", f"<!-- session {n}: added --><p>this {'round'}</p>") == \
        [f"a.html: session {n}", f"a.html: this {'round'}"]
    assert history_references("b.md", f"<!-- {sha} -->\n") == [f"b.md: {sha}"]
    assert history_references("b.md", f"measured at {sha}; the user loader of this session\n") == []
    assert history_references("a.py", f'SHA = "{sha}"  # a value, not a comment\nrun(["--rounds", "40"])\n') == []
    assert history_references("a.js", 'fetch("--rounds 40"); const d = 86400000; // decade\n') == []


def test_no_history_references_in_comments():
    found = []
    for path in tracked_files():
        if (not path.endswith(HISTORY_SUFFIXES) or path in HISTORY_EXEMPT
                or path.startswith(THIRD_PARTY)):
            continue
        file = ROOT / path
        if file.is_file():
            found += history_references(path, file.read_text())
    assert found == [], "describe what is (history belongs in CHANGELOG.md): " + "; ".join(found)
