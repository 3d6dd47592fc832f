"""One home for close codes: `changefeed.protocol.CloseCode` is complete (every code of
docs/protocol.md's close-code table is in it and every member is in the table), and no module
of publisher/ or listener/ writes a close code as a number."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from changefeed.protocol import CloseCode

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("publisher", "listener")
CLOSE_RANGE = range(1000, 1016)
APPLICATION_RANGE = range(4000, 5000)
KNOWN = {int(code) for code in CloseCode} - {CloseCode.NORMAL}
"""The codes a constant of any name may not be (1000 is too common a number to tell)."""
CLOSE_NAMES = re.compile(r"(^|_)(close_?)?code(s)?$|close|rejection|refus", re.IGNORECASE)
"""Names whose values are close codes: `code=`, `close_code`, `REJECTIONS`, `refused`..."""


def _is_close_number(node: ast.AST | None) -> bool:
    return (isinstance(node, ast.Constant) and type(node.value) is int
            and (node.value in CLOSE_RANGE or node.value in APPLICATION_RANGE))


def _line(node: ast.AST) -> int:
    line: int = getattr(node, "lineno", 0)
    return line


def _names(node: ast.AST) -> list[str]:
    """The names a node refers to (a Name's id, an Attribute's attr), throughout it."""
    found = []
    for part in ast.walk(node):
        if isinstance(part, ast.Name):
            found.append(part.id)
        elif isinstance(part, ast.Attribute):
            found.append(part.attr)
    return found


def close_code_literals(tree: ast.AST) -> list[int]:
    """The lines where a number in a close-code range is used as a close code: passed as a
    `code`, compared with or assigned to a name of one, or among other close codes in a
    collection or a call (`close_frame(1002, ...)`)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg and CLOSE_NAMES.search(node.arg):
            if _is_close_number(node.value):
                lines.add(node.value.lineno)
        elif isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            named = any(CLOSE_NAMES.search(n) for p in parts for n in _names(p))
            for part in parts:
                numbers = [part, *getattr(part, "elts", [])]
                lines.update(n.lineno for n in numbers if named and _is_close_number(n))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(
                CLOSE_NAMES.search(n) for t in targets for n in _names(t)
            ):
                lines.update(_line(n) for n in ast.walk(node.value) if _is_close_number(n))
            elif (isinstance(node.value, ast.Constant) and _is_close_number(node.value)
                    and node.value.value in KNOWN):
                lines.add(node.value.lineno)  # a constant of its own: PROTOCOL_ERROR = 1002
        elif isinstance(node, ast.Call) and any(
            CLOSE_NAMES.search(n) for n in _names(node.func)
        ):
            lines.update(a.lineno for a in node.args if _is_close_number(a))
        elif isinstance(node, ast.Dict | ast.Set | ast.Tuple | ast.List):
            members = node.keys if isinstance(node, ast.Dict) else node.elts
            closes = [m for m in members if m is not None and _is_close_number(m)]
            others = [m for m in members if m is not None and _is_close_member(m)]
            if closes and (len(closes) > 1 or others):
                lines.update(m.lineno for m in closes)
    return sorted(lines)


def _is_close_member(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and _names(node.value)[-1:] == ["CloseCode"]


def test_no_close_code_is_written_as_a_number_in_publisher_or_listener() -> None:
    found = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            found += [f"{path.relative_to(ROOT)}:{line}" for line in close_code_literals(tree)]
    assert found == [], "name close codes by changefeed.protocol.CloseCode: " + ", ".join(found)


def test_the_scan_finds_each_way_a_close_code_was_written() -> None:
    source = """
PROTOCOL_ERROR = 1002
REJECTIONS = frozenset({1002, CloseCode.UNSUPPORTED_DATA, 1007})
NOT_REFUSED = (None, 1000, 1001, 1005, 1006)
code = exc.rcvd.code if exc.rcvd is not None else 1006
if ws.close_code not in (None, 1000, 1001):
    pass
ws.close(code=4008)
transport.write(close_frame(1002, "unmasked"))
BATCH = 1000
SCAN = 1000
seconds = ms / 1000
KINDS = 4096
"""
    assert close_code_literals(ast.parse(source)) == [2, 3, 4, 5, 6, 8, 9]


def _table_codes() -> set[int]:
    """The codes of the rows of docs/protocol.md's "Close codes" table."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    section = text.split("## Close codes", 1)[1].split("\n## ", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d{4}) \|", section, re.MULTILINE)}


def test_the_close_code_table_of_the_docs_is_the_enum() -> None:
    assert _table_codes() == {int(code) for code in CloseCode}
