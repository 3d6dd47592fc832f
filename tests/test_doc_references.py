"""The docs name only what exists: every config.js key, route and `changefeed` flag that a page
of docs/ (or a README) names in code is one the code has.

- A config key is a dotted name alone in backticks in prose whose first part is a top-level key
  of config.js (`server.trustedProxies`, `limits.window`); it is checked by parsing a config.js
  that sets it: the parser's "one of the known keys" refusal of that key is the failure. A file
  name (`auth.py`) and an attribute of the API object of the same name (`bucket.commit`: the
  `ChangeBucket`; `feed.fetch`: a listener's; `outbox.cursor`: `publisher.outbox`'s) are not
  keys.
- A route is a path in code under `/changefeeds`, `/healthz`, `/readyz` or `/metrics`; it must
  match a route of a publisher's application (placeholders `<name>` and `{name}` match a path
  segment, a query string is left out).
- A flag is an `--option` on a `changefeed ...` command line in code; it must be an option of
  that (sub)command.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from changefeed.errors import ConfigError
from changefeed_cli import main
from publisher.config.settings import parse_config
from publisher.server.service import Service

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "clients" / "js" / "README.md"]
)
RESOURCES = 'resources: [{resource: "vm", subResources: ["nic"], bootstrapRoute: "/vms"}]'
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
KEY = re.compile(r"[a-z][A-Za-z0-9]*(?:\.[a-z][A-Za-z0-9]*)+")
ROUTE = re.compile(r"(?<![\w.:/])/(?:changefeeds|healthz|readyz|metrics)(?:/[\w.{}<>~:-]*)*")
COMMAND = re.compile(r"\bchangefeed((?: +[^\s|&;`'\"()]+)+)")
PLACEHOLDER = re.compile(r"<[^>/]*>|\{[^}/]*\}")


FILES = {"py", "lua", "js", "mjs", "ts", "md", "json", "html", "sock", "com", "org", "jsonl"}
JS_LISTENER = {"on", "done", "start", "close", "read", "register"}


def api_names() -> dict[str, set[str]]:
    """The attributes of the API objects that the docs name like config sections."""
    import publisher.outbox
    from listener import DurableConsumer, Listener, PullConsumer
    from publisher import ChangeBucket, connect

    config = parse_config(f"module.exports = {{{RESOURCES}}};")
    bucket = ChangeBucket(connect("redis://127.0.0.1:1/0"), "docs", config.resources)
    return {
        "bucket": set(dir(bucket)),
        "feed": {*dir(Listener), *dir(PullConsumer), *dir(DurableConsumer), *JS_LISTENER},
        "outbox": set(dir(publisher.outbox)),
    }


def prose_spans() -> Iterator[tuple[str, str]]:
    """(page, span) for every inline code span outside the fenced blocks of every page."""
    for page in DOCS:
        for span in SPAN.findall(FENCE.sub("", page.read_text())):
            yield page.relative_to(ROOT).as_posix(), span


def config_keys() -> Iterator[tuple[str, str]]:
    """(page, key) for every span that names a config key (see the module's docstring)."""
    sections = _top_level_keys()
    api = api_names()
    for page, span in prose_spans():
        if not KEY.fullmatch(span):
            continue
        first, second, *_ = span.split(".")
        if first in sections and span.rsplit(".", 1)[1] not in FILES \
                and second not in api.get(first, set()):
            yield page, span


def code_of(text: str) -> Iterator[str]:
    """The code of a page: its fenced blocks, then its inline spans outside them."""
    yield from FENCE.findall(text)
    yield from SPAN.findall(FENCE.sub("", text))


def named(pattern: re.Pattern[str]) -> Iterator[tuple[str, str]]:
    """(page, match) for every match of `pattern` in the code of every page."""
    for page in DOCS:
        for code in code_of(page.read_text()):
            for match in pattern.finditer(code):
                yield page.relative_to(ROOT).as_posix(), match.group(0)


def _top_level_keys() -> set[str]:
    try:
        parse_config(f"module.exports = {{{RESOURCES}, noSuchKey: 1}};")
    except ConfigError as exc:
        return set(str(exc.expected).removeprefix("one of the known keys: ").split(", "))
    raise AssertionError("an unknown top-level key was accepted")


def unknown_key(dotted: str) -> bool:
    """True when config.js refuses `dotted` as a key it does not know."""
    parts = dotted.split(".")
    value = "null"
    for part in reversed(parts):
        value = f"{{{part}: {value}}}"
    try:
        parse_config(f"module.exports = {{{RESOURCES}, {value[1:-1]}}};")
    except ConfigError as exc:
        refused = str(exc.key)
        return str(exc.expected).startswith("one of the known keys") and (
            dotted == refused or dotted.startswith(refused + ".")
        )
    return False


def test_every_config_key_the_docs_name_exists() -> None:
    wrong = sorted({(page, key) for page, key in config_keys() if unknown_key(key)})
    assert not wrong, f"docs name config keys config.js does not have: {wrong}"


def test_the_key_check_catches_a_key_that_does_not_exist() -> None:
    assert unknown_key("server.colour")
    assert unknown_key("clientLimits.colour")
    assert not unknown_key("server.trustedProxies")
    assert not unknown_key("limits.window")


@pytest.fixture(scope="module")
def routes() -> list[re.Pattern[str]]:
    """The paths a publisher's application routes, as patterns (nothing is started)."""
    config = parse_config(
        f'module.exports = {{{RESOURCES}, bucket: {{redisUrl: "redis://127.0.0.1:1/0"}}}};'
    )
    service = Service(config)
    patterns = []
    for resource in service.app.router.resources():
        info = resource.get_info()
        path = info.get("path") or info.get("formatter") or info.get("prefix")
        assert isinstance(path, str)
        regex = re.escape(path).replace(r"\{", "{").replace(r"\}", "}")
        regex = re.sub(r"\{[^}]+\}", "[^/]+", regex)
        patterns.append(re.compile(regex + ("(/.*)?" if "prefix" in info else "")))
    return patterns


def routed(path: str, routes: list[re.Pattern[str]]) -> bool:
    concrete = PLACEHOLDER.sub("x", path.rstrip(".:,"))
    return any(route.fullmatch(concrete) for route in routes)


def test_every_route_the_docs_name_exists(routes: list[re.Pattern[str]]) -> None:
    wrong = sorted({(page, path) for page, path in named(ROUTE) if not routed(path, routes)})
    assert not wrong, f"docs name routes the publisher does not serve: {wrong}"


def test_the_route_check_catches_a_route_that_does_not_exist(
    routes: list[re.Pattern[str]],
) -> None:
    assert routed("/changefeeds/stats", routes)
    assert routed("/changefeeds/durable/<name>/fetch", routes)
    assert not routed("/changefeeds/colours", routes)


def flag_error(line: str) -> str | None:
    """What is wrong with the flags of one `changefeed ...` command line, or None."""
    command: click.Command = main
    words = line.split()
    while words and isinstance(command, click.Group):
        if words[0] in command.commands:
            command = command.commands[words.pop(0)]
            continue
        option = next((p for p in command.params if words[0].split("=")[0] in p.opts), None)
        if option is None:
            break
        taken = words.pop(0)
        if not getattr(option, "is_flag", False) and "=" not in taken and words:
            words.pop(0)  # its value
    known = {"--help"} | {
        opt.split("=")[0]
        for param in command.params for opt in (*param.opts, *param.secondary_opts)
    }
    if command is not main:
        known |= {opt for param in main.params for opt in param.opts}
    bad = [word.split("=")[0] for word in words
           if word.startswith("--") and len(word) > 2 and word.split("=")[0] not in known]
    return f"{command.name}: {', '.join(bad)}" if bad else None


def test_every_flag_the_docs_name_exists() -> None:
    wrong = sorted({(page, error) for page, line in named(COMMAND)
                    if (error := flag_error(line.removeprefix("changefeed")))})
    assert not wrong, f"docs name flags the changefeed command does not take: {wrong}"


def test_the_flag_check_catches_a_flag_that_does_not_exist() -> None:
    assert flag_error("serve --config config.js") is None
    assert flag_error("outbox status --config config.js") is None
    assert flag_error("serve --colour red") == "serve: --colour"
    assert flag_error("--log-format json serve --config config.js") is None
    assert flag_error("--log-format json serve --colour red") == "serve: --colour"
