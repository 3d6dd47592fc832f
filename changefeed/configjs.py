"""Helpers for reading config.js files: the publisher's and the listener's configs share them.

A config.js is a JavaScript object literal (comments, unquoted keys, trailing commas), optionally
written as ``module.exports = { ... };``. Each validator takes the key's full name and the value
and returns the value or raises `ConfigError` naming the key, the value and what was expected, so
every config error of the project reads the same.

Pure code; the callers parse the literal (with json5) after `object_literal` has stripped the
``module.exports =`` around it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, quote, unquote, urlsplit

from changefeed.errors import ConfigError

T = TypeVar("T")

_MODULE_EXPORTS = re.compile(r"^((?:\s+|//[^\n]*(?:\n|$)|/\*.*?\*/)*)module\.exports\s*=\s*", re.S)
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
"""A name: a bucket, a resource, a sub-resource, a key."""


def object_literal(text: str) -> str:
    """The object literal of a config.js, without a leading ``module.exports =`` and the
    trailing ``;`` (comments before it are kept, so that line numbers stay right)."""
    return _MODULE_EXPORTS.sub(r"\1", text, count=1).rstrip().rstrip(";")


_DUPLICATE = re.compile(r'^Duplicate key "([^"]+)" found in object')
_JSON5_POSITION = re.compile(r"^<string>:(\d+) (.*?)(?: at column (\d+))?$", re.S)


def syntax_error(text: str, error: ValueError, source: str | None = None) -> ConfigError:
    """The ConfigError of a config.js that is not an object literal: with the file's name and
    the line (and column) of the fault, else the file's first characters. `object_literal`
    keeps the lines of the text, so json5's line is the file's."""
    position = _fault_position(text, str(error))
    if position is None:
        start, expected = text[:40] + "...", f"a JavaScript object literal ({error})"
        return ConfigError("<file>", start, expected,
                           f"{source or 'config.js'}: got {start!r}, expected {expected}")
    line, column, what = position
    where = f"{source or 'config.js'}:{line}" + (f":{column}" if column else "")
    lines = text.splitlines()
    found = lines[line - 1].strip()[:60] if line <= len(lines) else ""
    expected = f"a JavaScript object literal ({what})"
    return ConfigError(where, found, expected, f"{where}: got {found!r}, expected {expected}")


def _fault_position(text: str, message: str) -> tuple[int, str | None, str] | None:
    """(line, column or None, what) of json5's error `message`, when it can be told."""
    match = _JSON5_POSITION.match(message)
    if match is not None:
        return int(match.group(1)), match.group(3), match.group(2)
    duplicate = _DUPLICATE.match(message)
    if duplicate is None:
        return None
    # json5 does not say where: the key's second occurrence is the line to mend.
    key = re.escape(duplicate.group(1))
    keys = list(re.finditer(rf"(?m)(?:^|[{{,\s])[\"']?{key}[\"']?\s*:", text))
    if len(keys) < 2:
        return None
    return text.count("\n", 0, keys[1].end()) + 1, None, message


def section(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(key, value, "an object")
    return value


def only(obj: Mapping[str, Any], prefix: str, allowed: set[str] | Mapping[str, Any]) -> None:
    for key in obj:
        if key not in allowed:
            raise ConfigError(
                prefix + key, obj[key], f"one of the known keys: {', '.join(sorted(allowed))}"
            )


def get(
    obj: Mapping[str, Any], prefix: str, key: str, default: T, check: Callable[[str, Any], T]
) -> T:
    return check(prefix + key, obj[key]) if key in obj else default


def string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "a non-empty string")
    return value


def name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise ConfigError(key, value, "a name of letters, digits, '_', '.' or '-'")
    return value


def positive(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(key, value, "a positive number")
    return float(value)


def positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(key, value, "a positive integer")
    return value


def host(key: str, value: Any) -> str:
    return string(key, value)


def port(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(key, value, "a port number from 0 to 65535 (0: any free port)")
    return value


def address(key: str, text: str, what: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) as a pair; ConfigError naming `key` and saying it should be
    `what`'s address otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(key, text, f"{what} address host:port")
    return host, int(port)


def userinfo(netloc: str) -> tuple[str, str | None, str | None]:
    """A URL's network location as (hosts, username, password): `[user:]password@hosts`, each
    part unquoted; `password@hosts` (no colon) is a password alone, as redis-py reads it."""
    info, at, hosts = netloc.rpartition("@")
    if not at:
        return hosts, None, None
    user, colon, secret = info.partition(":")
    if colon:
        return hosts, unquote(user) or None, unquote(secret)
    return hosts, None, unquote(user)


@dataclass(frozen=True, slots=True)
class HostsUrl:
    """A URL that names several hosts (`scheme://[[user]:password@]host:port[,host:port...]/...`,
    as redis+sentinel:// and redis+cluster:// do), split: its parts, its hosts as pairs, and
    the credentials of its user part, unquoted."""

    parts: SplitResult
    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None


def hosts_url(key: str, url: str, scheme: str, expected: str, *, host: str,
              node: str) -> HostsUrl:
    """`url` split as a `HostsUrl` of `scheme`; ConfigError naming `key` (the URL shown
    without passwords) and saying `expected` when it is not one, or lacks a host (`host`
    names one in the message: "sentinel"), or a host is not `node`'s address ("a sentinel")."""
    shown = masked_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(key, shown, expected) from None
    if parts.scheme != scheme:
        raise ConfigError(key, shown, expected)
    hosts, username, password = userinfo(parts.netloc)
    if not hosts:
        raise ConfigError(key, shown, f"{expected} with at least one {host} host:port")
    nodes = tuple(address(key, piece, node) for piece in hosts.split(","))
    return HostsUrl(parts, nodes, username, password)


def hosts_netloc(nodes: Iterable[tuple[str, int]], username: str | None,
                 password: str | None) -> str:
    """The network location of a `HostsUrl` again: the user part (quoted) and the hosts."""
    user = ""
    if password is not None:
        user = f"{quote(username or '', safe='')}:{quote(password, safe='')}@"
    return user + ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in nodes)


def masked_url(url: str) -> str:
    """`url` with its password masked as `***`, in the user part (`redis://u:pw@h`) and in a
    `password=` query parameter, for logs and error messages. A URL too malformed to tell where
    its password is comes back as a placeholder."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<malformed URL, not shown>"
    netloc = parts.netloc
    if password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    pieces = parts.query.split("&") if parts.query else []
    query = "&".join(
        piece.partition("=")[0] + "=***"
        if unquote(piece.partition("=")[0]).lower() in ("password", "sentinelpassword")
        else piece
        for piece in pieces
    )
    masked = url.replace(parts.netloc, netloc, 1) if netloc != parts.netloc else url
    return masked.replace("?" + parts.query, "?" + query, 1) if query != parts.query else masked


def redis_url(key: str, value: Any) -> str:
    """A Redis URL; the errors show it with its password masked (`masked_url`)."""
    expected = "a redis://, rediss:// or unix:// URL, or null for the embedded Redis"
    if not isinstance(value, str):
        raise ConfigError(key, value, expected)
    shown = masked_url(value)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ConfigError(key, shown, "a URL with a valid port") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(key, shown, expected)
    if parts.scheme == "unix" and not parts.path:
        raise ConfigError(key, shown, "a unix:// URL with a socket path")
    if parts.scheme != "unix" and not parts.hostname:
        raise ConfigError(key, shown, "a redis:// URL with a host")
    return value


def optional_positive(key: str, value: Any) -> float | None:
    return None if value is None else positive(key, value)


__all__ = ["NAME", "HostsUrl", "address", "get", "host", "hosts_netloc", "hosts_url",
           "masked_url", "object_literal", "only", "optional_positive", "port", "positive",
           "positive_int", "redis_url", "section", "string", "syntax_error", "userinfo"]
