"""Each part owns its state: no module assigns an attribute of an object it does not own.

A module may assign `self.x` and `cls.x`, and the attributes that a class of its own declares
(a dataclass's fields, or what its methods assign on `self`): the values it defines, built and
changed where they are defined. Anything else -- `hub.unread = ...` in the tail,
`conn.live = False` in the hub, `self.hub.trace = ...` in the service, `hub.closed[k] += 1` in
the keepalive -- changes another part's state behind its back: it asks that part instead, by a
method (`Lagging.fall_behind`, `Counters.close`, `FanOut.trace_with`).

The attribute's name stands for its owner's class (the AST has no types): a module that writes
`x.position` passes when a class of its own declares `position`. So the test can miss a write
whose name a class of the writing module happens to declare too; it never flags one it should
not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISHER = ROOT / "publisher"
PACKAGES = ("publisher", "listener", "changefeed", "changefeed_testing")
"""What the rule covers: the publisher, the listener library, the shared core, the testing kit."""

FRAMEWORK = {
    # ssl.SSLContext is configured by assigning its attributes (the ssl module's own API).
    ("publisher/security/tls.py", "context.minimum_version"),
    ("publisher/security/tls.py", "context.verify_mode"),
    # logging's root logger: its handlers are replaced at configure(), as logging documents.
    ("publisher/config/logs.py", "root.handlers"),
    # aiohttp's response headers are set on the response a handler builds and returns.
    ("publisher/web/metrics.py", "response.headers"),
    # aiohttp's websocket reader: the publisher reads frames with its own parser
    # (publisher.web.websocket), installed in place of aiohttp's on the protocol.
    ("publisher/web/websocket.py", "protocol._parser"),
    # psycopg2's connection and cursor are configured by assignment (its documented API).
    ("publisher/capture/database.py", "conn.autocommit"),
    ("publisher/capture/session.py", "conn.autocommit"),
    ("publisher/capture/session.py", "cur.itersize"),
}
"""Framework objects that are configured by assignment, each (module, target) with its reason."""

def _declared(tree: ast.Module) -> set[str]:
    """The attribute names the module's classes declare: class-body names and `self.x` (a
    `Protocol` declares another class's names, not its own)."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        if _is_protocol(cls):
            continue
        for node in ast.walk(cls):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return names


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any(ast.unparse(b) in ("Protocol", "typing.Protocol") for b in cls.bases)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found: list[ast.expr] = []
        for target in node.targets:
            found.extend(target.elts if isinstance(target, ast.Tuple) else [target])
        return found
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def foreign_writes(path: Path) -> list[str]:
    """`line: target` of each assignment in `path` to an attribute it does not own."""
    module = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    tree = ast.parse(path.read_text())
    own = _declared(tree)
    out = []
    for node in ast.walk(tree):
        for target in _targets(node):
            written = target.value if isinstance(target, ast.Subscript) else target
            if not isinstance(written, ast.Attribute):
                continue  # a name, or an item of a local container
            base = written.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if written.attr in own or (module, ast.unparse(written)) in FRAMEWORK:
                continue
            out.append(f"{module}:{written.lineno}: {ast.unparse(target)}")
    return out


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_writes_only_its_own_attributes(path: Path) -> None:
    assert foreign_writes(path) == []


def test_the_check_finds_what_it_forbids(tmp_path: Path) -> None:
    """The rule itself: each kind of foreign write is found, the owner's own writes are not."""
    sample = tmp_path / "_sample.py"  # not in the tree: other workers walk it meanwhile
    text = '''
from dataclasses import dataclass

@dataclass
class Mine:
    size: int

class Part:
    def __init__(self, hub):
        self.hub = hub
        self.count = 0

    def act(self, conn, mine: Mine):
        self.count += 1
        mine.size = 2
        conn.live = False
        self.hub.trace = None
        conn.hub.closed["x"] += 1
        a, conn.position = 1, 2
'''
    sample.write_text(text)
    found = [w.split(": ", 1)[1] for w in foreign_writes(sample)]
    assert found == ["conn.live", "self.hub.trace", "conn.hub.closed['x']", "conn.position"]


def test_no_protocol_names_another_class_s_private_members() -> None:
    """A structural type (`typing.Protocol`) names a public face; one listing `_private` members
    copies another class's inside."""
    found = []
    for path in _modules():
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            if not _is_protocol(cls):
                continue
            for item in cls.body:
                name = (item.target.id if isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        else getattr(item, "name", ""))
                if name.startswith("_") and not name.startswith("__"):
                    found.append(f"{path.relative_to(ROOT)}: {cls.name}.{name}")
    assert found == []
