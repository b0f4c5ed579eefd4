"""The code's shape: rlhf/ is plain ML (no Flask, no webapp) grouped by pipeline stage, each stage
importing only the stages below it; webapp/ is grouped by feature and its import graph is a tree
(no cycles between modules or between features); benchmarks/ import each other without a cycle too;
and the module map in docs/architecture.md names every module there is.

Imports are read from the source (every ``import`` statement, including those inside
functions), so a cycle hidden behind a function-level import is still found.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT  # noqa: E402

FEATURES = ("core", "serving", "experiments", "chat", "training", "admin", "safety", "openai_api")
# rlhf/'s stages, bottom up: a module may import its own stage and the stages on lower levels only.
# The top-level modules settings, algorithms and progress are the shared vocabulary; cycle runs it all.
RLHF_LEVELS = (
    ("algorithms", "progress"),
    ("settings",),
    ("data", "training"),
    ("models",),
    ("generation", "trust", "sim"),  # sim: simulated users for tests and benchmarks, not a pipeline stage
    ("safety", "reward"),
    ("policy",),
    ("gate",),
    ("cycle",),
)


def modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imported_names(name: str, path: Path) -> set[str]:
    """Absolute names of everything ``path`` (module ``name``) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            found.add(stem)
            found.update(f"{stem}.{alias.name}" for alias in node.names)  # "from pkg import module"
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    mods = modules(package)
    graph = {}
    for name, path in mods.items():
        targets = set()
        for imported in imported_names(name, path):
            # the longest known module the name starts with ("webapp.core.models.User" -> webapp.core.models)
            while imported and imported not in mods:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                targets.add(imported)  # importing a parent package only runs its (small) __init__
        graph[name] = {t for t in targets if not (t == package and name != package)}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def feature_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FEATURES else None


def test_rlhf_imports_neither_flask_nor_webapp():
    offenders = {name: sorted(n for n in imported_names(name, path)
                              if n.split(".")[0] in ("flask", "flask_sqlalchemy", "flask_login", "flask_wtf",
                                                     "flask_limiter", "werkzeug", "webapp"))
                 for name, path in modules("rlhf").items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_webapp_modules_import_no_cycle():
    graph = import_graph("webapp")
    assert len(graph) > 20  # the walk found the modules
    assert "webapp.core.models" in graph["webapp.chat.routes"]  # and their imports
    assert find_cycle(graph) is None


def test_features_depend_on_each_other_as_a_tree():
    """Between feature packages too: core depends on no feature; no two features need each other."""
    graph = import_graph("webapp")
    features: dict[str, set[str]] = {f: set() for f in FEATURES}
    for module, targets in graph.items():
        source = feature_of(module)
        if source is None:
            continue  # the app factory, CLI and WSGI entry assemble every feature
        for target in targets:
            dest = feature_of(target)
            assert dest is not None, f"{module} imports the app assembly module {target}"
            if dest != source:
                features[source].add(dest)
    assert features["core"] == set()
    assert find_cycle(features) is None, features


def stage_of(module: str) -> str:
    return module.split(".")[1] if module != "rlhf" else ""


def test_rlhf_modules_import_no_cycle():
    graph = import_graph("rlhf")
    assert "rlhf.reward.scoring" in graph["rlhf.reward.criteria_heads"]  # the walk found modules and imports
    assert find_cycle(graph) is None


def test_benchmarks_import_no_cycle():
    """Benchmarks build on each other's helpers (closed_loop.py's server and simulated users,
    stage_timing.py's side-by-side timing): a benchmark imports what it builds on, never what builds on it."""
    graph = import_graph("benchmarks")
    assert "benchmarks.closed_loop" in graph["benchmarks.deployment_shape"]  # the walk found modules and imports
    assert find_cycle(graph) is None


def test_rlhf_stages_depend_downward():
    """Each rlhf/ module lives in a known stage and imports only its own stage or lower ones."""
    level = {stage: i for i, stages in enumerate(RLHF_LEVELS) for stage in stages}
    graph = import_graph("rlhf")
    unknown = sorted(m for m in graph if m != "rlhf" and stage_of(m) not in level)
    assert unknown == [], "add these to a stage in RLHF_LEVELS"
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                    if m != "rlhf" and t != "rlhf" and stage_of(t) != stage_of(m)
                    and level[stage_of(t)] >= level[stage_of(m)])
    assert upward == []


def test_find_cycle_finds_one():
    """The checker itself: a planted cycle is reported, a tree is not."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def architecture_map() -> set[str]:
    """File paths named by the architecture map (docs/architecture.md, "Module map"): an indented
    tree (two spaces a level) of folders ending in "/" and files, each followed by what it does."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Module map"):]
    block = section.split("```")[1]
    paths, folders = set(), []
    for line in block.splitlines():
        name = line.strip().split(" ")[0]
        if not name or not re.match(r"^[\w.]+/?$", name):
            continue  # a description's continuation line, or "templates/, static/"
        depth = (len(line) - len(line.lstrip(" "))) // 2
        del folders[depth:]
        if name.endswith("/"):
            folders.append(name)
        else:
            paths.add("".join(folders) + name)
    return paths


@pytest.mark.parametrize("package", ["webapp", "rlhf"])
def test_architecture_map_names_every_module(package):
    """The architecture map lists each module where it is, and no module that is gone."""
    listed = {p for p in architecture_map() if p.startswith(package + "/") and p.endswith(".py")}
    actual = {str(p.relative_to(ROOT)) for p in modules(package).values()
              if not (p.name == "__init__.py" and (p.parent != ROOT / package or not p.read_text().strip()))
              and p.parent.name != "versions"}  # Alembic revisions: the map names their folder
    assert sorted(actual - listed) == [], "modules missing from docs/architecture.md's module map"
    assert sorted(listed - actual) == [], "docs/architecture.md's module map names modules that do not exist"


def test_rlhf_tests_are_grouped_by_stage():
    """tests/rlhf/ has a folder per stage of rlhf/ it tests, and no loose test file but those of the
    top-level modules (rlhf/cycle.py: test_cycle_*.py)."""
    tests = ROOT / "tests" / "rlhf"
    stages = {p.name for p in (ROOT / "rlhf").iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders and sorted(folders - stages) == []
    assert all((tests / folder / "__init__.py").is_file() for folder in folders)
    top_level = {p.stem for p in (ROOT / "rlhf").glob("*.py")}
    loose = [p.name for p in tests.glob("test_*.py") if p.stem.split("_")[1] not in top_level]
    assert loose == []


def test_no_stage_imports_the_simulated_users():
    """rlhf/sim/ is the simulated users of tests and benchmarks (an HTTP client of the web app among
    them), not a step of the pipeline: no other rlhf/ module imports it."""
    graph = import_graph("rlhf")
    assert sorted(m for m, targets in graph.items() if stage_of(m) != "sim"
                  and any(stage_of(t) == "sim" for t in targets)) == []
