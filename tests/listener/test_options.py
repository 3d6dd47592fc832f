"""Every client's options and HTTP plumbing, written once (listener/options.py): the same keyword
arguments or one `options=` value for `Listener`, `PullConsumer` and `DurableConsumer`; a session
given is shared and left open, one of the client's own is closed with it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from changefeed.backoff import Backoff
from changefeed.errors import InvalidOption, RetriesExhausted
from listener import BootstrapDone, DurableConsumer, Listener, ListenerConfig, PullConsumer
from listener.options import base_url, client_options, options_of
from publisher.server.service import Service
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
