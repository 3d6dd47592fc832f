"""docs/architecture.md against the tree: a table row per module, none for a module that is gone.

The module tables sit under headings that name their package in backticks (`` `publisher/web/` ``);
a row's first cell names one module of it (`` | `fleet.py` | ... ``). A package's `__init__` is
its public surface, described in the prose, not a row (as in tests/test_imports.py). The picture
at the top names every sub-package of the publisher. Each failure says what to add or remove.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("changefeed", "publisher", "listener", "changefeed_testing")

HEADING = re.compile(r"^#{2,4} .*?`((?:" + "|".join(PACKAGES) + r")(?:/\w+)*/)`")
ROW = re.compile(r"^\| `(\w+\.py)` \|")


def modules() -> set[str]:
    """Every module of the packages, as a path from the root (`publisher/web/fleet.py`)."""
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }


def headings(text: str) -> set[str]:
    """The packages that have a heading of their own (`publisher/web/`)."""
    return {m.group(1) for line in text.splitlines() if (m := HEADING.match(line))}


def rows(text: str) -> list[str]:
    """The module of each table row, as a path from the root, in the order of the document."""
    found: list[str] = []
    package: str | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = HEADING.match(line)
            package = heading.group(1) if heading else None
        elif package and (row := ROW.match(line)):
            found.append(package + row.group(1))
    return found


def summary(path: str) -> str:
    """The first line of a module's docstring: the row it wants, at first."""
    docstring = ast.get_docstring(ast.parse((ROOT / path).read_text())) or "(no docstring)"
    return docstring.splitlines()[0]


def test_every_module_has_a_row() -> None:
    text = DOC.read_text()
    missing = sorted(modules() - set(rows(text)))
    known = headings(text)

    def where(package: str) -> str:
        if package in known:
            return f"under the heading naming `{package}`"
        return f"under a new heading naming `{package}` in backticks (### `{package}`: ...)"

    assert not missing, "docs/architecture.md has no row for:\n" + "\n".join(
        f"  {path}: add | `{Path(path).name}` | ... | {where(Path(path).parent.as_posix() + '/')}"
        f" (its docstring begins: {summary(path)})"
        for path in missing
    )


def test_every_row_names_a_module_that_exists() -> None:
    extra = sorted(set(rows(DOC.read_text())) - modules())
    assert not extra, "docs/architecture.md has a row for a module that does not exist:\n" + (
        "\n".join(f"  {path}: remove its row, or name the module where it went" for path in extra)
    )


def test_each_module_has_one_row() -> None:
    found = rows(DOC.read_text())
    twice = sorted({path for path in found if found.count(path) > 1})
    assert not twice, f"docs/architecture.md has more than one row for: {', '.join(twice)}"


def test_the_picture_names_every_sub_package_of_the_publisher() -> None:
    text = DOC.read_text()
    picture = text[: text.index("## Names")]
    sub_packages = sorted(
        path.parent.name for path in (ROOT / "publisher").glob("*/__init__.py")
    )
    absent = [name for name in sub_packages if not re.search(rf"(?<![\w/]){name}/ ", picture)]
    assert not absent, (
        "the picture at the top of docs/architecture.md lacks the publisher's sub-package(s) "
        f"{', '.join(absent)}: draw each at its level (tests/test_imports.py's LEVELS)"
    )


def test_the_rows_are_read_from_the_tables_of_every_package() -> None:
    """The parser itself: it sees a row of each package, nested ones too, and none elsewhere."""
    found = rows(DOC.read_text())
    nested = "changefeed_testing/conformance/"
    for package in ("changefeed/", "publisher/bucket/", "listener/", nested):
        assert any(path.startswith(package) and "/" not in path[len(package):] for path in found)
    sample = "## `listener/`\n| `a.py` | x |\n## Redis keys\n| `b.py` | y |\n"
    assert rows(sample) == ["listener/a.py"]
