"""The README's promise: two set-up commands, and CI runs the test one verbatim."""
from __future__ import annotations

import re
import subprocess

from tests.support.paths import ROOT  # noqa: E402


def block_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\s*```bash\n(.*?)\n```", text, re.S)
    assert match, f"README has no {marker} block"
    return match.group(1).strip()


def test_quickstart_has_exactly_two_commands():
    quickstart = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert quickstart.count("```bash") == 2
    run, test = block_after("run-command"), block_after("test-command")
    assert "\n" not in run and "\n" not in test
    assert "flask --app webapp serve" in run and "pytest" in test and "chromium" in test


def test_ci_extracts_the_readme_test_command():
    script = (ROOT / ".ci" / "run").read_text()
    awk = re.search(r"cmd=\$\((awk .*?README\.md)\)", script).group(1)
    out = subprocess.run(["bash", "-c", awk], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert out == block_after("test-command")


def test_torch_is_pinned_exactly():
    assert re.search(r'"torch==2\.13\.0"', (ROOT / "pyproject.toml").read_text())
