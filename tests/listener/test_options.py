"""Every client's options and HTTP plumbing, written once (listener/options.py): the same keyword
arguments or one `options=` value for `Listener`, `PullConsumer` and `DurableConsumer`; a session
given is shared and left open, one of the client's own is closed with it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from changefeed.backoff import Backoff
from changefeed.errors import ChangefeedError, InvalidOption, PullFailed, RetriesExhausted
from changefeed.logs import get_logger
from listener import BootstrapDone, DurableConsumer, Listener, ListenerConfig, PullConsumer
from listener.options import base_url, client_options, options_of, report_retry
from publisher.server.service import Service
from tests.records import logged
from tests.servers import free_port, scaled


def test_client_options_name_what_was_wrong() -> None:
    with pytest.raises(InvalidOption, match="backoff"):
        client_options(backoff=0.5)  # type: ignore[arg-type]
    for timeout in (0, -1, True, "5"):
        with pytest.raises(InvalidOption, match="http_timeout"):
            client_options(http_timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="token_file"):
        client_options(token="a", token_file="/nonexistent")
    with pytest.raises(InvalidOption, match="not to be given with options="):
        options_of(client_options(), {"token": "a"})
    with pytest.raises(InvalidOption, match="url"):
        base_url("127.0.0.1:8080")
    assert base_url("ws://h:1/changefeeds") == "http://h:1"


def test_one_options_value_or_the_keyword_arguments_for_every_client() -> None:
    options = client_options(token="secret", backoff=Backoff(1, 2), http_timeout=7)
    url = "http://127.0.0.1:1"
    clients: list[Any] = [
        Listener(url, instance="i", service="s", resources={"vm": ["nic"]}, options=options),
        PullConsumer(url, options=options),
        DurableConsumer(url, "billing", options=options),
    ]
    for client in clients:
        assert client.options is options
        assert client._headers(url + "/vms", url) == {"Authorization": "Bearer secret"}
    assert PullConsumer(url, token="secret").options.credentials.token == "secret"
    assert DurableConsumer(url, "billing", http_timeout=7).timeout == 7
    assert DurableConsumer(url, "billing").timeout == 30
    with pytest.raises(InvalidOption, match="token"):
        PullConsumer(url, options=options, token="other")


async def test_a_given_session_stays_open_and_an_own_one_is_closed() -> None:
    url = "http://127.0.0.1:1"
    async with aiohttp.ClientSession() as shared:
        for given in (shared, None):
            made: list[Any] = [
                Listener(url, instance="i", service="s", resources={"vm": ["nic"]},
                         session=given),
                PullConsumer(url, session=given),
                DurableConsumer(url, "billing", session=given),
            ]
            for client in made:
                async with client:
                    session = client._http()
                    assert (session is shared) == (given is shared)
                assert session.closed == (given is None), type(client).__name__
        assert not shared.closed


async def test_a_listener_and_a_consumer_share_one_session(publisher: Service) -> None:
    await publisher.bucket.commit("vm", "a", ["nic"], {"uuid": "a"})
    async with aiohttp.ClientSession() as shared:
        options = client_options(session=shared)
        async with asyncio.timeout(scaled(20)):
            async with Listener(publisher.url, instance="i-1", service="tcns",
                                resources={"vm": ["nic"]}, options=options) as feed:
                async for event in feed:
                    if isinstance(event, BootstrapDone):
                        break
            async with PullConsumer(publisher.url, resource="vm", options=options) as consumer:
                items = await consumer.fetch(10, expires=1, idle_heartbeat=0.5)
        assert [item.changed_resource_id for item in items] == ["a"]
        assert not shared.closed


async def test_the_backoff_argument_of_a_listener_wins_over_its_config() -> None:
    """The config retries for ever; `backoff=` gives up after one retry."""
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = ListenerConfig(open_timeout=scaled(2))
    feed = Listener(url, instance="i-1", service="tcns", resources={"vm": ["nic"]},
                    config=config, backoff=Backoff(initial=0.01, maximum=0.01, retries=1))
    async with feed, asyncio.timeout(scaled(10)):
        with pytest.raises(RetriesExhausted):
            async for _ in feed:
                pass


def test_both_pull_consumers_report_a_retried_failure_through_the_one_helper() -> None:
    """`ErrorHandler` and the report of a retried failure are written once (listener/options.py),
    and `PullConsumer` and `DurableConsumer` take them from there."""
    import listener.consumer
    import listener.durable
    import listener.options

    for module in (listener.consumer, listener.durable):
        assert module.ErrorHandler is listener.options.ErrorHandler
        assert module.report_retry is listener.options.report_retry
        assert "ErrorHandler = " not in Path(module.__file__ or "").read_text()
    seen: list[ChangefeedError] = []
    error = PullFailed("http://p/events", "ConnectionResetError")
    with logged("listener.test") as records:
        report_retry(get_logger("listener.test"), "pull failed; backing off", error, 0.12345, 2,
                     seen.append)
        report_retry(get_logger("listener.test"), "again", error, 1.0, 3, None)
    assert seen == [error]
    assert [(r["event"], r["delay"], r["failures"], r["error_type"]) for r in records] == [
        ("pull failed; backing off", 0.123, 2, "PullFailed"), ("again", 1.0, 3, "PullFailed"),
    ]


def test_the_timeouts_are_every_clients_options() -> None:
    for name in ("http_timeout", "open_timeout", "ping_interval", "ping_timeout"):
        for wrong in (-1, True, "5"):
            with pytest.raises(InvalidOption, match=name):
                client_options(**{name: wrong})  # type: ignore[arg-type]
    with pytest.raises(InvalidOption, match="open_timeout"):
        client_options(open_timeout=0)
    options = client_options(open_timeout=3, ping_interval=0, ping_timeout=0)
    assert (options.open_timeout, options.ping_interval, options.ping_timeout) == (3, 0, 0)


async def test_a_clients_open_timeout_bounds_its_connect() -> None:
    url = "http://127.0.0.1:1"
    config = ListenerConfig(open_timeout=4, http_timeout=9)
    clients: list[Any] = [
        Listener(url, instance="i", service="s", resources={"vm": ["nic"]}, open_timeout=3,
                 config=config),
        PullConsumer(url, open_timeout=3),
        DurableConsumer(url, "billing", options=client_options(open_timeout=3)),
    ]
    for client in clients:
        async with client:
            assert client._http().timeout.sock_connect == 3, type(client).__name__
    async with Listener(url, instance="i", service="s", resources={"vm": ["nic"]},
                        config=config) as feed:  # the config's, as before
        assert (feed._http().timeout.sock_connect, feed._http().timeout.total) == (4, 9)
    async with PullConsumer(url) as consumer:  # aiohttp's default, as before
        assert consumer._http().timeout == aiohttp.client.DEFAULT_TIMEOUT


async def test_the_open_timeout_argument_of_a_listener_wins_over_its_config() -> None:
    """A publisher that accepts the connection and never answers the upgrade: the listener's
    `open_timeout=` gives up on it long before its config's 60 s."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the listener gives up and closes
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = ListenerConfig(open_timeout=60)
    errors: list[ChangefeedError] = []
    async with server:
        feed = Listener(f"http://127.0.0.1:{port}", instance="i-1", service="tcns",
                        resources={"vm": ["nic"]}, config=config, open_timeout=0.2,
                        backoff=Backoff(initial=0.01, maximum=0.01, retries=1))
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with feed, asyncio.timeout(scaled(10)):
            with pytest.raises(RetriesExhausted):
                await feed.run(on_error=errors.append)
        assert loop.time() - started < scaled(5)
    assert [(type(e).__name__, "TimeoutError" in str(e)) for e in errors] == [
        ("ConnectionLost", True)
    ]
