"""Pagination of bootstrap routes: pure functions from a response to objects and the next URL.

The listener fetches each page itself (`listener.connection`); a pager only says which URL to
fetch first and, given a response, which objects it holds and which URL comes next. Plug in your
own for a bootstrap route that is an existing API with its own paging.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import orjson

from changefeed.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Page:
    """The objects of one page and the absolute URL of the next (None after the last page)."""

    objects: tuple[Any, ...]
    next_url: str | None


class Pager(Protocol):
    """How to walk one bootstrap route."""

    def first(self, route_url: str) -> str:
        """The URL of the first page, given the route's absolute URL."""
        ...

    def parse(self, url: str, headers: Mapping[str, str], body: bytes) -> Page:
        """The objects of the page fetched from `url` and the next URL. Raises ProtocolError."""
        ...


def _with_query(url: str, **params: str | int) -> str:
    """`url` with `params` set (in place, where it has them already); other parameters are kept,
    repeated ones (a watch's `id=`, `prefix=`) too."""
    parts = urlsplit(url)
    unset = {key: str(value) for key, value in params.items()}
    query = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in params:
            query.append((key, value))
        elif key in unset:
            query.append((key, unset.pop(key)))
    query += unset.items()
    return urlunsplit(parts._replace(query=urlencode(query)))


def _json(url: str, body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ProtocolError(f"bootstrap page {url} is not JSON") from None


@dataclass(frozen=True, slots=True)
class PublisherPager:
    """The publisher's own bootstrap routes: `{"items": [...], "next": "<relative URL>"|null}`."""

    limit: int = 100

    def first(self, route_url: str) -> str:
        return _with_query(route_url, limit=self.limit)

    def parse(self, url: str, headers: Mapping[str, str], body: bytes) -> Page:
        page = _json(url, body)
        if not isinstance(page, dict) or not isinstance(page.get("items"), list):
            raise ProtocolError(f"bootstrap page {url} has no items list")
        following = page.get("next")
        if following is not None and not isinstance(following, str):
            raise ProtocolError(f"bootstrap page {url}: next must be a URL or null")
        return Page(tuple(page["items"]), None if not following else urljoin(url, following))


@dataclass(frozen=True, slots=True)
class OffsetPager:
    """An API answering a JSON list to `?offset=N&limit=M`; a short page is the last."""

    limit: int = 100
    offset_param: str = "offset"
    limit_param: str = "limit"

    def first(self, route_url: str) -> str:
        return _with_query(route_url, **{self.offset_param: 0, self.limit_param: self.limit})

    def parse(self, url: str, headers: Mapping[str, str], body: bytes) -> Page:
        objects = _json(url, body)
        if not isinstance(objects, list):
            raise ProtocolError(f"bootstrap page {url} is not a JSON list")
        if len(objects) < self.limit:
            return Page(tuple(objects), None)
        offset = int(dict(parse_qsl(urlsplit(url).query)).get(self.offset_param, 0))
        return Page(tuple(objects), _with_query(url, **{self.offset_param: offset + len(objects)}))


_LINK = re.compile(r'<([^>]*)>\s*;[^,]*?rel="?next"?', re.I)


@dataclass(frozen=True, slots=True)
class LinkHeaderPager:
    """An API answering a JSON list with an RFC 8288 `Link: <url>; rel="next"` header."""

    limit: int | None = None
    limit_param: str = "limit"

    def first(self, route_url: str) -> str:
        if self.limit is None:
            return route_url
        return _with_query(route_url, **{self.limit_param: self.limit})

    def parse(self, url: str, headers: Mapping[str, str], body: bytes) -> Page:
        objects = _json(url, body)
        if not isinstance(objects, list):
            raise ProtocolError(f"bootstrap page {url} is not a JSON list")
        link = next((value for key, value in headers.items() if key.lower() == "link"), "")
        match = _LINK.search(link)
        return Page(tuple(objects), urljoin(url, match.group(1)) if match else None)
