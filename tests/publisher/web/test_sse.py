"""Server-sent events (issue 17, item 3) against a real publisher and Redis: aiohttp and curl
clients, Last-Event-ID resume, watches, scopes, and a slow SSE reader closed like a slow
websocket."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from changefeed.sse import Event, EventParser
from publisher.bucket import Change
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.publisher.layouts import own, owns
from tests.publisher.web.test_metrics import scrape
from tests.servers import RedisServer, eventually, scaled


class Stream:
    """An SSE stream read with aiohttp: `next()` the next event."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.parser = EventParser()
        self.pending: list[Event] = []

    async def next(self, timeout: float = 5.0) -> Event:
        while not self.pending:
            line = await asyncio.wait_for(self.response.content.readline(), scaled(timeout))
            if not line:
                raise EOFError("stream ended")
            self.parser.feed(line.decode())
            self.pending.extend(self.parser.events())
        return self.pending.pop(0)

    async def changes(self, count: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while len(out) < count:
            event = await self.next()
            assert event.name == "change", event
            item = orjson.loads(event.data)
            assert item["cursor"] == event.id
            out.append(item)
        return out


@asynccontextmanager
async def stream(url: str, query: str, **headers: str) -> AsyncIterator[Stream]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/changefeeds/sse?{query}", headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"] == "text/event-stream"
        yield Stream(response)


async def test_changes_arrive_as_events_and_last_event_id_resumes(
    layout_publisher: Service,
) -> None:
    publisher = layout_publisher
    bucket = publisher.bucket
    async with stream(publisher.url, "resource=vm&sub=nic&service=tcns") as feed:
        registered = await feed.next()
        assert registered.name == "registered"
        reply = orjson.loads(registered.data)
        assert reply["resumed"] is False and reply["bootstrapRoutes"][0]["bootstrapRoute"] == "/vms"
        assert registered.id == reply["cursor"]
        c1 = await bucket.commit("vm", "vm-1", ["nic"], {"n": 1})
        await bucket.commit("vm", "vm-2", ["alias"], {"n": 2})  # not for this stream
        c3 = await bucket.commit("vm", "vm-3", ["nic", "alias"], {"n": 3})
        items = await feed.changes(2)
        # Order across shards is not commit order on a bucket in a Redis Cluster.
        assert sorted(owns(items)) == sorted([own(c1, "vm-1"), own(c3, "vm-3")])
        first = next(i for i in items if i["changedResourceId"] == "vm-1")
        assert first["changeKind"] == {"resource": "vm", "subResources": ["nic"]}
    c4 = await bucket.commit("vm", "vm-4", ["nic"], {"n": 4})
    async with stream(publisher.url, "resource=vm&sub=nic", **{"Last-Event-ID": c1}) as feed:
        registered = await feed.next()
        assert orjson.loads(registered.data)["resumed"] is True
        assert sorted(owns(await feed.changes(2))) == sorted([own(c3, "vm-3"), own(c4, "vm-4")])
    async with stream(publisher.url, "resource=vm&sub=*&since=abcdefgh.000000000001a1") as feed:
        assert orjson.loads((await feed.next()).data)["resumed"] is False
        resync = await feed.next()
        assert resync.name == "resync" and "bootstrap again" in orjson.loads(resync.data)["reason"]


async def test_a_watch_narrows_the_stream(layout_publisher: Service) -> None:
    publisher = layout_publisher
    async with stream(publisher.url, "resource=vm&sub=*&prefix=servers&id=vm-9") as feed:
        await feed.next()
        await publisher.bucket.commit("vm", "serversX", ["nic"], {})
        c2 = await publisher.bucket.commit("vm", "servers/1", ["nic"], {})
        c3 = await publisher.bucket.commit("vm", "vm-9", ["alias"], {})
        got = owns(await feed.changes(2))
        assert sorted(got) == sorted([own(c2, "servers/1"), own(c3, "vm-9")])


async def test_bad_queries_are_400(layout_publisher: Service) -> None:
    publisher = layout_publisher
    async with aiohttp.ClientSession() as http:
        for query, code in [
            ("resource=disk&sub=nic", "InvalidRegistration"),
            ("resource=vm", "InvalidRegistration"),
            ("resource=vm&sub=nic&since=zz", "InvalidCursor"),
            ("resource=vm&sub=nic&bogus=1", "InvalidQuery"),
        ]:
            async with http.get(f"{publisher.url}/changefeeds/sse?{query}") as response:
                assert response.status == 400, query
                assert (await response.json())["code"] == code


async def test_a_refused_scope_is_403(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = make_config(
        redis_server.url,
        auth={"tokens": [{"name": "nets", "sha256": hashlib.sha256(b"t" * 32).hexdigest(),
                          "scopes": ["listen:network"]}]},
    )
    async with start_publisher(config) as service, aiohttp.ClientSession() as http:
        headers = {"Authorization": "Bearer " + "t" * 32}
        url = f"{service.url}/changefeeds/sse?resource=vm&sub=nic"
        async with http.get(url, headers=headers) as response:
            assert response.status == 403
            assert "lacks listen:vm" in (await response.json())["message"]
        async with http.get(url) as response:
            assert response.status == 401
        url = f"{service.url}/changefeeds/sse?resource=network&sub=ips"
        async with stream(service.url, "resource=network&sub=ips", **headers) as feed:
            assert (await feed.next()).name == "registered"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_reads_the_stream(publisher: Service) -> None:
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sN", f"{publisher.url}/changefeeds/sse?resource=vm&sub=nic",
        stdout=asyncio.subprocess.PIPE,
    )
    assert curl.stdout is not None
    try:
        parser = EventParser()
        events: list[Event] = []
        committed: str | None = None
        while len(events) < 2:
            line = await asyncio.wait_for(curl.stdout.readline(), scaled(5))
            assert line, "curl's stream ended"
            parser.feed(line.decode())
            events.extend(parser.events())
            if events and committed is None:
                committed = await publisher.bucket.commit("vm", "vm-1", ["nic"], {})
        assert [e.name for e in events] == ["registered", "change"]
        assert events[1].id == committed
    finally:
        curl.terminate()
        await curl.wait()


async def test_a_slow_sse_reader_is_closed_like_a_slow_websocket(
    redis_server: RedisServer, make_config: Callable[..., Config], start_publisher: PublisherFactory
) -> None:
    config = make_config(
        redis_server.url, limits={"window": 200, "sendBuffer": 16384, "pingInterval": 60}
    )
    async with start_publisher(config) as service:
        host, port = service.url.removeprefix("http://").split(":")
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, int(port)))
        await loop.sock_sendall(
            sock, f"GET /changefeeds/sse?resource=vm&sub=nic HTTP/1.1\r\nHost: {host}\r\n\r\n"
            .encode(),
        )
        await asyncio.sleep(0)
        fast: list[str] = []
        async with stream(service.url, "resource=vm&sub=nic") as other:
            await other.next()
            committed: list[str] = []
            for batch in range(100):
                committed += await service.bucket.commit_many(
                    [Change.put("vm", f"{batch}-{i}-" + "x" * 470, ["nic"], {}) for i in range(50)]
                )
                fast += [i["cursor"] for i in await other.changes(50)]
                if service.hub.counters.closed["slowConsumer"]:
                    break
            assert service.hub.counters.closed["slowConsumer"] == 1
            assert fast == committed, "the fast stream got everything"
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        data = b""
        while True:
            got = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), scaled(5))
            if not got:
                break
            data += got
        sock.close()
        assert data.endswith(b"0\r\n\r\n")
        assert b"event: close" in data and b'"code":4008' in data


async def test_shutdown_ends_the_stream_with_a_close_event(
    config: Config, start_publisher: PublisherFactory
) -> None:
    async with aiohttp.ClientSession() as http:
        async with start_publisher(config) as service:
            response = await http.get(f"{service.url}/changefeeds/sse?resource=vm&sub=nic")
            feed = Stream(response)
            assert (await feed.next()).name == "registered"
        close = await feed.next()
        assert close.name == "close" and orjson.loads(close.data)["code"] == 1001
        with pytest.raises(EOFError):
            await feed.next()
        response.release()


async def test_sse_streams_are_counted_in_stats_and_metrics(layout_publisher: Service) -> None:
    publisher = layout_publisher
    async with stream(publisher.url, "resource=vm&sub=nic&service=web") as feed:
        assert (await feed.next()).name == "registered"
        cursors = [await publisher.bucket.publish("vm", f"vm-{i}", ["nic"]) for i in range(3)]
        got = owns(await feed.changes(3))
        assert sorted(got) == sorted(own(c, f"vm-{i}") for i, c in enumerate(cursors))
        samples, types, _ = await scrape(publisher)
        assert samples["changefeed_sse_subscribers", ()] == 1
        assert types["changefeed_sse_items_sent"] == "counter"
        assert samples["changefeed_sse_items_sent_total", ()] == 3
        async with aiohttp.ClientSession() as http, http.get(
            publisher.url + "/changefeeds/stats"
        ) as response:
            stats = (await response.json())["sse"]
        assert stats == {"subscribers": 1, "itemsSent": 3,
                         "disconnects": {"listener": 0, "publisher": 0}}
    await eventually(lambda: publisher.hub.counters.sse_ended["listener"] == 1, "the stream ended")
    samples, _, _ = await scrape(publisher)
    assert samples["changefeed_sse_subscribers", ()] == 0
    assert samples["changefeed_sse_disconnects_total", (("by", "listener"),)] == 1
    assert samples["changefeed_sse_disconnects_total", (("by", "publisher"),)] == 0
    # The stream's trace: written to the one listener of service "web".
    async with aiohttp.ClientSession() as http, http.get(
        f"{publisher.url}/changefeeds/trace/{cursors[0]}"
    ) as response:
        assert (await response.json())["services"]["web"]["listeners"] == 1
