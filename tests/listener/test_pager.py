"""Pagers are pure: a response in, objects and the next URL out."""

from __future__ import annotations

import orjson
import pytest

from changefeed.errors import ProtocolError
from listener.pager import LinkHeaderPager, OffsetPager, Page, PublisherPager


def test_publisher_pager_follows_next() -> None:
    pager = PublisherPager(limit=2)
    first = pager.first("http://h:1/vms")
    assert first == "http://h:1/vms?limit=2"
    body = orjson.dumps({"items": [{"uuid": "a"}, {"uuid": "b"}],
                         "next": "/vms?limit=2&marker=Yg", "cursor": "e.1"})
    assert pager.parse(first, {}, body) == Page(
        ({"uuid": "a"}, {"uuid": "b"}), "http://h:1/vms?limit=2&marker=Yg"
    )
    assert pager.parse(first, {}, b'{"items": [], "next": null}') == Page((), None)


@pytest.mark.parametrize("body", [b"nope", b"[]", b'{"items": 1}', b'{"items": [], "next": 1}'])
def test_publisher_pager_rejects_other_bodies(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        PublisherPager().parse("http://h/vms", {}, body)


def test_offset_pager_stops_at_a_short_page() -> None:
    pager = OffsetPager(limit=2)
    url = pager.first("http://h/vms?state=running")
    assert url == "http://h/vms?state=running&offset=0&limit=2"
    page = pager.parse(url, {}, b"[1, 2]")
    assert page == Page((1, 2), "http://h/vms?state=running&offset=2&limit=2")
    assert page.next_url is not None
    assert pager.parse(page.next_url, {}, b"[3]") == Page((3,), None)
    with pytest.raises(ProtocolError):
        pager.parse(url, {}, b"{}")


def test_link_header_pager_follows_rel_next() -> None:
    pager = LinkHeaderPager(limit=10)
    url = pager.first("http://h/api/vms")
    assert url == "http://h/api/vms?limit=10"
    headers = {"Link": '</api/vms?page=2>; rel="next", </api/vms?page=9>; rel="last"'}
    assert pager.parse(url, headers, b"[1]") == Page((1,), "http://h/api/vms?page=2")
    last = {"link": '</api/vms?page=1>; rel="first"'}
    assert pager.parse(url, last, b"[]") == Page((), None)
    assert LinkHeaderPager().first("http://h/x") == "http://h/x"


def test_pagers_keep_repeated_parameters_of_the_route_url() -> None:
    """A watch's `id=` and `prefix=` parameters survive the pager's own."""
    route = "http://h/vms?id=a&id=b%2Fc&prefix=servers"
    assert PublisherPager(limit=2).first(route) == (
        "http://h/vms?id=a&id=b%2Fc&prefix=servers&limit=2"
    )
    assert PublisherPager(limit=2).first(route + "&limit=9") == (
        "http://h/vms?id=a&id=b%2Fc&prefix=servers&limit=2"
    )
    pager = OffsetPager(limit=1)
    page = pager.parse(pager.first(route), {}, b"[1]")
    assert page.next_url == "http://h/vms?id=a&id=b%2Fc&prefix=servers&offset=1&limit=1"
