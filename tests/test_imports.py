"""The import graph of every package: no circle, and the publisher's sub-packages in one direction.

Imports made only for type checking count (a circle hidden behind `if TYPE_CHECKING:` is still a
circle of design), and so do imports inside functions. A package's `__init__` re-exports; it is
no node of the design.

The direction (docs/architecture.md draws it): a module may import its own sub-package and those
of lower levels, never one above or beside it.

    bucket (Redis only) < config < security < delivery < pull < web < server < cli
    spark: beside security, above config (a Spark job needs the bucket and config.js, no server)
    outbox: beside pull (the relay commits to the bucket; the service starts it)
    capture: beside pull and outbox (the capture commits to the bucket; the service starts it)

`changefeed` (the shared core) imports neither side; `listener` imports only the core.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("changefeed", "publisher", "listener", "changefeed_testing")

LEVELS = {
    "bucket": 0,
    "config": 1,
    "security": 2,
    "spark": 2,
    "delivery": 3,
    "pull": 4,
    "outbox": 4,
    "capture": 4,
    "web": 5,
    "server": 6,
    "cli": 7,
}
"""The publisher's sub-packages by level: imports run from a higher level to a lower one."""


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                continue
            found[".".join(parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph`, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _sub_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "publisher" and len(parts) > 2 else None


def test_no_import_circle_in_any_package() -> None:
    graph = _graph()
    assert "publisher.server.service" in graph and graph["listener.consumer"]
    circle = _circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_every_publisher_module_is_in_a_sub_package() -> None:
    loose = [m for m in _graph() if m.startswith("publisher.") and _sub_package(m) is None]
    assert loose == []
    unknown = {_sub_package(m) for m in _graph()} - {None, *LEVELS}
    assert unknown == set(), "a sub-package without a level in LEVELS"


def test_the_publisher_imports_run_one_way() -> None:
    wrong = []
    for module, imported in _graph().items():
        mine = _sub_package(module)
        if mine is None:
            continue
        for other in imported:
            theirs = _sub_package(other)
            if theirs is None or theirs == mine:
                continue
            if LEVELS[theirs] >= LEVELS[mine]:
                wrong.append(f"{module} ({mine}) imports {other} ({theirs})")
    assert wrong == []


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("changefeed", {"changefeed"}),
        ("listener", {"changefeed", "listener"}),
        ("publisher", {"changefeed", "publisher"}),
    ],
)
def test_packages_import_only_what_sits_below_them(package: str, allowed: set[str]) -> None:
    wrong = [
        f"{module} imports {other}"
        for module, imported in _graph().items()
        if module.split(".")[0] == package
        for other in imported
        if other.split(".")[0] not in allowed
    ]
    assert wrong == []


def test_handlers_do_not_import_the_service() -> None:
    graph = _graph()
    for module, imported in graph.items():
        if _sub_package(module) == "web":
            assert "publisher.server.service" not in imported, module
