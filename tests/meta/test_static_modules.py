"""The pages' JavaScript: native ES modules, no build step. Each module stays small, every import
names a file and an export that exist (a wrong one would only fail in the browser), no modules import
each other in a circle, the pages load their scripts as modules, and one module (static/js/http.js)
is the only one that calls fetch()."""
from __future__ import annotations

import re
from pathlib import Path

from tests.meta.test_architecture import architecture_map, find_cycle
from tests.support.paths import ROOT  # noqa: E402

JS = ROOT / "static" / "js"
MAX_LINES = 400
FETCH_HELPER = JS / "http.js"

IMPORT = re.compile(r"^\s*(?:import\s+(?P<names>[^;\"'`]*?)|export\s+(?P<reexport>\{[^}]*\}|\*[\w\s]*?))"
                    r"\s*from\s*[\"'](?P<spec>[^\"']+)[\"']", re.M)
BARE_IMPORT = re.compile(r"^\s*import\s*[\"'](?P<spec>[^\"']+)[\"']", re.M)
EXPORT_DECL = re.compile(r"^export\s+(?:async\s+)?(?:function\*?|const|let|var|class)\s+([A-Za-z_$][\w$]*)", re.M)
EXPORT_LIST = re.compile(r"^export\s*\{([^}]*)\}", re.M)


def modules() -> list[Path]:
    return sorted(JS.rglob("*.js"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_of(path: Path) -> str:
    """The source without its comments (a comment may name fetch() or an import)."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return re.sub(r"(^|\s)//[^\n]*", r"\1", text)


def exports_of(path: Path) -> set[str]:
    code = code_of(path)
    names = set(EXPORT_DECL.findall(code))
    for group in EXPORT_LIST.findall(code):
        names.update(part.split(" as ")[-1].strip() for part in group.split(",") if part.strip())
    return names


def imports_of(path: Path) -> list[tuple[str, set[str] | None]]:
    """(specifier, the names imported from it, or None for a namespace or side-effect import)."""
    code = code_of(path)
    found: list[tuple[str, set[str] | None]] = []
    for m in IMPORT.finditer(code):
        names = m.group("names") or m.group("reexport")
        braces = re.search(r"\{([^}]*)\}", names)
        wanted = ({part.split(" as ")[0].strip() for part in braces.group(1).split(",") if part.strip()}
                  if braces else None)
        found.append((m.group("spec"), wanted))
    found += [(m.group("spec"), None) for m in BARE_IMPORT.finditer(code)]
    return found


def test_the_walk_finds_the_modules():
    names = {rel(p) for p in modules()}
    assert {"static/js/http.js", "static/js/admin.js", "static/js/markdown.js", "static/js/chat/main.js"} <= names
    assert "static/js/chat.js" not in names
    assert imports_of(JS / "chat" / "main.js") and imports_of(JS / "admin.js") == [("./http.js", {"api"})]


def test_no_module_is_long():
    long = {rel(p): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split modules over {MAX_LINES} lines"


def test_every_import_resolves_to_a_file_and_its_exports():
    problems = []
    for path in modules():
        for spec, names in imports_of(path):
            if not spec.startswith(("./", "../")):
                problems.append(f"{rel(path)}: {spec!r} is not a relative path (no bundler resolves it)")
                continue
            target = (path.parent / spec).resolve()
            if not target.is_file():
                problems.append(f"{rel(path)}: {spec!r} does not exist")
                continue
            missing = (names or set()) - exports_of(target)
            if missing:
                problems.append(f"{rel(path)}: {rel(target)} exports no {sorted(missing)}")
    assert problems == []


def import_graph() -> dict[str, set[str]]:
    """Each module's relative imports (static imports and re-exports), as repository paths."""
    return {rel(path): {rel((path.parent / spec).resolve()) for spec, _ in imports_of(path)
                        if spec.startswith(("./", "../"))}
            for path in modules()}


def test_modules_import_no_cycle():
    """In a cycle the evaluation order matters: a module whose top level uses a const or class of
    another module in the cycle can find it uninitialized (a ReferenceError, in the browser only)."""
    graph = import_graph()
    assert "static/js/http.js" in graph["static/js/chat/stream.js"]  # the walk found the imports
    assert find_cycle(graph) is None


def test_every_action_a_view_calls_is_bound():
    """The views call the modules that redraw them through static/js/chat/actions.js (an import would
    close a cycle), which no import check covers: main.js must bind each action a view calls, by the
    name of an import (whose export the check above confirms), and no action nobody calls."""
    called = {name for path in modules() for name in re.findall(r"(?<![\w$./])actions\.(\w+)", code_of(path))}
    binding = re.search(r"bindActions\(\{([^}]*)\}\)", code_of(JS / "chat" / "main.js"))
    assert binding, "static/js/chat/main.js binds no actions"
    bound = {part.strip() for part in binding.group(1).split(",") if part.strip()}
    imported = {name for _, names in imports_of(JS / "chat" / "main.js") for name in names or ()}
    assert len(called) > 5 and called == bound
    assert bound <= imported


def test_one_module_calls_fetch():
    """The CSRF header, the JSON errors and the answer stream's request all live in http.js."""
    callers = [rel(p) for p in modules() if re.search(r"(?<![\w$.])fetch\s*\(", code_of(p))]
    assert callers == [rel(FETCH_HELPER)]
    users = {rel(p) for p in modules() if any(spec.endswith("/http.js") for spec, _ in imports_of(p))}
    assert "static/js/admin.js" in users and "static/js/chat/stream.js" in users


def test_pages_load_their_scripts_as_modules():
    """The templates load static/js only with <script type="module"> (the vendored markdown-it
    UMD build stays a classic deferred script, run before the modules, in document order)."""
    loaded = []
    for template in sorted((ROOT / "templates").rglob("*.html")):
        for tag in re.findall(r"<script\b[^>]*>", template.read_text()):
            src = re.search(r"filename='([^']+)'", tag).group(1)
            assert (ROOT / "static" / src).is_file(), tag
            if src.startswith("js/"):
                assert 'type="module"' in tag, f"{template.name}: {tag}"
                loaded.append(src)
            else:
                assert src.startswith("vendor/") and " defer" in tag, f"{template.name}: {tag}"
    assert sorted(loaded) == ["js/admin.js", "js/chat/main.js"]


def test_modules_are_served_as_javascript(client):
    """Browsers refuse a module script served with another MIME type (and nosniff is on)."""
    for path in ("/static/js/chat/main.js", "/static/js/http.js", "/static/js/admin.js"):
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert resp.mimetype in ("text/javascript", "application/javascript"), (path, resp.mimetype)


def test_architecture_map_names_every_module():
    listed = {p for p in architecture_map() if p.startswith("static/js/")}
    assert sorted(listed ^ {rel(p) for p in modules()}) == []
