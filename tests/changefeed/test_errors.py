"""changefeed/errors.py draws its hierarchy at the top: every exception of the module is in the
drawing, under its real parent."""

from __future__ import annotations

import inspect
import re

from changefeed import errors


def drawn_parents() -> dict[str, str | None]:
    """Each name of the drawing, and the name it hangs under (None for the root)."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []  # (column of the name, name)
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^( *(?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)(?= |$)", line)
        if not match or not line.startswith("    "):
            continue
        column = match.start(2)
        while stack and stack[-1][0] >= column:
            stack.pop()
        parents[match.group(2)] = stack[-1][1] if stack else None
        stack.append((column, match.group(2)))
    return parents


def test_every_exception_is_drawn_under_its_parent() -> None:
    classes = {
        name: cls for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, BaseException)
        and cls.__module__ == errors.__name__
    }
    parents = drawn_parents()
    assert sorted(set(classes) - set(parents)) == [], "not drawn"
    for name, cls in classes.items():
        parent = parents[name]
        expected = None if parent is None else classes[parent]
        base = next((b for b in cls.__bases__ if b.__module__ == errors.__name__), None)
        assert base is expected, f"{name} is drawn under {parent}, but derives from {base}"
