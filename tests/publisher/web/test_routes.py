"""Routes you can see: each route module of publisher/web declares its `routes`, the service's
`ROUTE_MODULES` is the one list of them, no other code adds a route, and the routes a service
serves (paths and methods) are those users know."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from publisher.config.settings import Config
from publisher.server.service import ROUTE_MODULES, Service

ROOT = Path(__file__).resolve().parents[3]
ADDERS = frozenset({"add_get", "add_post", "add_put", "add_patch", "add_delete", "add_head",
                    "add_route", "add_view", "add_static", "add_resource", "add_routes"})

ROUTES = {
    ("GET", "/changefeeds"),
    ("GET", "/changefeeds/stats"),
    ("GET", "/changefeeds/sse"),
    ("GET", "/changefeeds/events"),
    ("POST", "/changefeeds/rpc"),
    ("GET", "/changefeeds/feed/v1"),
    ("GET", "/changefeeds/durable"),
    ("PUT", "/changefeeds/durable/{name}"),
    ("GET", "/changefeeds/durable/{name}"),
    ("DELETE", "/changefeeds/durable/{name}"),
    ("POST", "/changefeeds/durable/{name}/fetch"),
    ("GET", "/changefeeds/durable/{name}/dead"),
    ("POST", "/changefeeds/durable/{name}/ack"),
    ("POST", "/changefeeds/durable/{name}/nak"),
    ("POST", "/changefeeds/durable/{name}/in_progress"),
    ("POST", "/changefeeds/durable/{name}/term"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/changefeeds/dashboard"),
    ("GET", "/changefeeds/trace"),
    ("GET", "/changefeeds/trace/{cursor}"),
    ("GET", "/vms"),
    ("GET", "/vms/{id}"),
    ("GET", "/networks"),
    ("GET", "/networks/{id}"),
}
"""What the test config's publisher serves (each GET with its HEAD)."""


def _route_adders(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in ADDERS
    ]


def _declares_routes(path: Path) -> bool:
    tree = ast.parse(path.read_text(), str(path))
    return any(
        isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "routes" for t in node.targets
        )
        for node in tree.body
    )


def test_only_the_service_adds_routes_and_it_lists_every_route_module() -> None:
    service = ROOT / "publisher" / "server" / "service.py"
    adding = {
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "publisher").rglob("*.py")) if path != service
        for line in _route_adders(path)
    }
    assert adding == set(), "declare routes in a module-level `routes` instead"
    assert len(_route_adders(service)) == 2  # ROUTE_MODULES' routes, the resources' routes
    declaring = {
        path.stem for path in (ROOT / "publisher" / "web").glob("*.py") if _declares_routes(path)
    }
    assert declaring == {module.__name__.rpartition(".")[2] for module in ROUTE_MODULES}


def test_a_service_serves_the_routes_users_know(
    make_config: Callable[..., Config],
) -> None:
    service = Service(make_config("redis://127.0.0.1:1"))  # not started: nothing connects
    served = {
        (route.method, route.resource.canonical)
        for route in service.app.router.routes() if route.resource is not None
    }
    assert served == ROUTES | {("HEAD", path) for method, path in ROUTES if method == "GET"}
