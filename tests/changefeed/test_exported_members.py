"""The core's public surface is `changefeed.__all__`; the core imports no I/O library."""

from __future__ import annotations

import inspect
import subprocess
import sys

import changefeed


def test_all_is_sorted_and_complete() -> None:
    assert changefeed.__all__ == sorted(changefeed.__all__)
    exported = {name for name in dir(changefeed)
                if not name.startswith("_") and not inspect.ismodule(getattr(changefeed, name))}
    assert exported == set(changefeed.__all__)


def _imported_by(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_core_imports_no_io_library_and_neither_side() -> None:
    modules = _imported_by(
        "import changefeed.protocol, changefeed.cursor, changefeed.watch, changefeed.longpoll, "
        "changefeed.feed, changefeed.backoff, changefeed.retry, changefeed.configjs, "
        "changefeed.errors, changefeed.durable"
    )
    roots = {name.split(".")[0] for name in modules}
    assert roots.isdisjoint({"publisher", "listener", "aiohttp", "redis", "websockets", "json5"})


def test_import_listener_loads_no_server_no_redis_and_no_publisher() -> None:
    modules = _imported_by("import listener")
    assert not {m for m in modules if m.split(".")[0] in ("publisher", "redis")}
    assert not {m for m in modules if m.startswith("aiohttp.web")}
