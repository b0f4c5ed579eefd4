"""No module over MAX_LINES lines without a reason: a longer file says why it stays one file in its
docstring (Python) or leading comment (JavaScript), in a sentence starting "One module because".

Walks webapp/, rlhf/ and benchmarks/ (*.py) and static/js/ (*.js).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

MAX_LINES = 400
REASON = "One module because"
SOURCES = (("webapp", "*.py"), ("rlhf", "*.py"), ("benchmarks", "*.py"), ("static/js", "*.js"))



def sources() -> list[Path]:
    return [path for folder, pattern in SOURCES for path in sorted((ROOT / folder).rglob(pattern))]


def leading_text(path: Path) -> str:
    """The module's docstring (Python) or the comments before its first line of code (JavaScript),
    whitespace and comment markers collapsed to single spaces."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        found = ast.get_docstring(ast.parse(text, str(path))) or ""
    else:
        lines, in_block = [], False
        for line in text.splitlines():
            stripped = line.strip()
            if in_block or stripped.startswith(("//", "/*")):
                in_block = (in_block or stripped.startswith("/*")) and "*/" not in stripped
                lines.append(re.sub(r"^(//+|/\*+|\*+/?)|\*+/$", "", stripped))
            elif stripped:
                break
        found = "\n".join(lines)
    return " ".join(found.split())


def unexplained_long_files(paths: list[Path]) -> list[Path]:
    return [path for path in paths
            if len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES and REASON not in leading_text(path)]


def test_long_modules_say_why_they_are_one_module():
    paths = sources()
    assert len(paths) > 100  # the walk found the sources
    offenders = [str(path.relative_to(ROOT)) for path in unexplained_long_files(paths)]
    assert offenders == [], (f"over {MAX_LINES} lines: split them, or say why not in the docstring "
                             f"(leading comment for JavaScript), in a sentence starting {REASON!r}")


@pytest.mark.parametrize("suffix, header", [
    (".py", '"""What it does.\n\nOne module\nbecause it reads top to bottom."""\n'),
    (".js", "// What it does.\n// One module because it reads\n// top to bottom.\n"),
    (".js", "/* What it does.\n * One module because it reads top to bottom. */\n"),
])
def test_checker_reads_the_reason(tmp_path, suffix, header):
    """The checker itself: a long file passes with the reason at its top, not without it, nor with
    the reason further down; a short one needs none."""
    line = "x = 1\n" if suffix == ".py" else "let x = 1;\n"
    files = {name: tmp_path / f"{name}{suffix}" for name in ("explained", "silent", "below", "short")}
    files["explained"].write_text(header + line * MAX_LINES)
    files["silent"].write_text(header.replace("One module", "A long module") + line * MAX_LINES)
    files["below"].write_text(line + header + line * MAX_LINES)
    files["short"].write_text(line * MAX_LINES)
    assert unexplained_long_files(list(files.values())) == [files["silent"], files["below"]]
