"""axe-core accessibility checks for the browser tests (axe-playwright-python bundles axe-core,
so nothing is fetched at run time). The script is injected through the DevTools protocol
(``page.evaluate``), which the page's Content-Security-Policy does not apply to."""
from __future__ import annotations

from typing import Any

BLOCKING_IMPACTS = ("serious", "critical")


def axe_violations(page, impacts: tuple[str, ...] = BLOCKING_IMPACTS) -> list[dict[str, Any]]:
    """axe's violations on ``page`` as it is now, of the given impacts."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    return [v for v in results.response["violations"] if v.get("impact") in impacts]


def describe(violations: list[dict[str, Any]]) -> str:
    lines = []
    for v in violations:
        targets = ", ".join(str(n["target"]) for n in v.get("nodes", [])[:5])
        lines.append(f"{v['impact']}: {v['id']} ({v['help']}) at {targets}")
    return "\n".join(lines)


def assert_accessible(page, where: str = "") -> None:
    """No serious or critical axe-core violation on ``page``."""
    found = axe_violations(page)
    assert not found, f"axe violations{' on ' + where if where else ''}:\n{describe(found)}"
