"""What counts as narrating history (a work item or a commit) in a comment or a doc: such text
belongs in CHANGELOG.md, since it means nothing to a reader of the tree and goes stale.
tests/meta/test_docs.py applies it to the docs, tests/meta/test_repository_hygiene.py to comments."""
from __future__ import annotations

import re

WORK_ITEM = [
    re.compile(r"\bissues?\s+#?\d+", re.I),                   # "issue 15", "issues 15 and 16"
    re.compile(r"(?<!--)\brounds?\s+\d+\b", re.I),             # "round 3" (not an option: --rounds 40)
    re.compile(r"(?:\b|_)sessions?[\s_]*\d+\b", re.I),         # "session 5", "ab_validity_session5"
    re.compile(r"\bthis (?:round|issue|task)\b", re.I),       # "the changes of this round"
]
# a commit: 7-40 hex digits with a letter and a digit, not part of a longer word, number, path,
# hex colour (#a1b2c3d) or hash (64 hex digits)
COMMIT = re.compile(r"(?<![#\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


def work_items(text: str) -> list[str]:
    return [m.group(0) for pattern in WORK_ITEM for m in pattern.finditer(text)]


def commits(text: str) -> list[str]:
    return [m.group(0) for m in COMMIT.finditer(text)]


def history(text: str) -> list[str]:
    return work_items(text) + commits(text)
