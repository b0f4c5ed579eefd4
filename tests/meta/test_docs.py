"""The README is the front door and docs/ the manual: the README stays short and starts with the
Quickstart; every relative link (and its anchor) resolves; every repository path the docs or the
code's docstrings name exists; and the docs describe what is, without narrating history (issues,
rounds, sessions, commits: that belongs in CHANGELOG.md)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.history import history
from tests.support.paths import ROOT  # noqa: E402

DOCS = sorted((ROOT / "docs").rglob("*.md"))
MARKDOWN = [ROOT / "README.md", *DOCS]
RESULTS = [ROOT / "benchmarks" / "RESULTS.md", ROOT / "benchmarks" / "RESULTS.notes.md"]


def rel(path: Path, root: Path = ROOT) -> str:
    return str(path.relative_to(root))


def prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


# ---------------------------------------------------------------------------- the README


def test_readme_is_the_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 300, "the README is the front door: move details to docs/"
    sections = re.findall(r"^## (.+)$", prose(text), flags=re.M)
    assert sections and sections[0] == "Quickstart"


# ---------------------------------------------------------------------------- links

def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", path.read_text(), flags=re.S | re.M)  # not in code blocks
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*\s*$", text, flags=re.M):
        base = name = slug(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading))
        n = 0
        while name in found:  # repeated headings get -1, -2, ...
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Relative links of ``path`` (a file under ``root``) whose file (or anchor) does not exist."""
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{rel(path, root)}: {target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{rel(path, root)}: {target} (no such heading in {rel(dest, root)})")
    return broken


@pytest.mark.parametrize("path", MARKDOWN + RESULTS, ids=rel)
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_link_check_finds_a_broken_link(tmp_path):
    """The checker itself: a missing file and a missing anchor are reported, good links are not."""
    root = tmp_path.resolve()
    (root / "docs").mkdir()
    (root / "docs" / "a.md").write_text("# A\n\n## Two words\n")
    page = root / "README.md"
    page.write_text("[ok](docs/a.md) [ok](docs/a.md#two-words) [ok](#readme) [ext](https://x.example/y)\n"
                    "# README\n`[code](nowhere.md)`\n[gone](docs/b.md) [bad anchor](docs/a.md#three)\n")
    assert broken_links(page, root) == ["README.md: docs/b.md (no such file)",
                                  "README.md: docs/a.md#three (no such heading in docs/a.md)"]


# ---------------------------------------------------------------------------- repository paths

PATH = re.compile(r"(?<![\w/.-])((?:webapp|rlhf|benchmarks|tests|docs|static|templates)/[\w./-]*)")


def named_paths(text: str) -> set[str]:
    """Repository paths named in ``text`` (``rlhf/models/loading.py``, ``webapp/core/``), without
    patterns (``tests/test_*.py``, ``runs/run-<id>/``) and sentence punctuation."""
    found = set()
    for m in PATH.finditer(text):
        if text[m.end():m.end() + 1] in ("*", "<", "{", "["):
            continue
        found.add(m.group(1).rstrip(".-"))
    return found


def docstrings(path: Path) -> str:
    tree = ast.parse(path.read_text())
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                                         ast.AsyncFunctionDef))]
    return "\n".join(filter(None, (ast.get_docstring(n, clean=False) for n in nodes)))


def dead_paths(text: str) -> list[str]:
    return sorted(p for p in named_paths(text)
                  if not (ROOT / p).exists())


CODE = sorted(p for package in ("webapp", "rlhf", "benchmarks") for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", MARKDOWN + RESULTS, ids=rel)
def test_paths_named_in_the_docs_exist(path):
    assert dead_paths(path.read_text()) == []


def test_paths_named_in_docstrings_exist():
    dead = {rel(p): d for p in CODE if (d := dead_paths(docstrings(p)))}
    assert dead == {}


def test_path_check_finds_a_made_up_path():
    text = ("See `rlhf/models/loading.py`, webapp/core/ and docs/architecture.md. Not "
            "`rlhf/models/made_up.py`, nor (benchmarks/no_such_benchmark.py); tests/test_*.py is a "
            "pattern, /srv/rlhf/instance an absolute path.")
    assert named_paths(text) >= {"rlhf/models/loading.py", "webapp/core/", "docs/architecture.md"}
    assert dead_paths(text) == ["benchmarks/no_such_benchmark.py", "rlhf/models/made_up.py"]


# ---------------------------------------------------------------------------- no history

@pytest.mark.parametrize("path", MARKDOWN + RESULTS, ids=rel)
def test_docs_describe_what_is(path):
    """History (which issue, round or commit changed what) goes to CHANGELOG.md."""
    assert history(path.read_text()) == []


def test_history_check_finds_history_and_nothing_else():
    assert history("Before issue 15 (62d081f) every preference took one cycle; the changes of this "
                   "round; measured at commit `7010bdc`; ab_validity_session5.json") == [
        "issue 15", "_session5", "this round", "62d081f", "7010bdc"]
    assert history("SQLite group commit; max-age=31536000; colour #a1b2c3d; default-bf8423b3522f; "
                   "3 rounds each; 1 round left; signin_timing.py --rounds 40; a session's generation; defaced; "
                   "sha256 " + "ab12" * 16) == []
