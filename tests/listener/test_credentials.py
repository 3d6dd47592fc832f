"""The clients' credentials against a real publisher over TLS with tokens: the `Listener`, the
`PullConsumer`, `changefeed snoop` and `changefeed stats` (token argument, token file or
CHANGEFEED_TOKEN; an SSL context or a CA file). No token ever printed or logged."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
import structlog

from changefeed.credentials import Credentials, pick_token, same_origin
from changefeed.errors import AccessDenied, InvalidOption, RegistrationRejected
from listener import Listener, ListenerConfig, PullConsumer
from listener.credentials import load_credentials
from listener.events import BootstrapDone, Change
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.pki import Pki, new_token, sha256_hex
from tests.records import logged
from tests.servers import RedisServer, eventually, scaled

FAST = ListenerConfig(open_timeout=scaled(5))


def test_the_token_comes_from_the_argument_the_file_or_the_environment() -> None:
    env = {"CHANGEFEED_TOKEN": " from-env\n"}
    assert pick_token("arg", "file", env) == "arg"
    assert pick_token(None, "file\n", env) == "file"
    assert pick_token(None, None, env) == "from-env"
    assert pick_token(None, None, {}) is None
    with pytest.raises(ValueError, match="token file") as error:
        pick_token(None, "two words", env)
    assert "two words" not in str(error.value)


def test_the_token_goes_to_the_publishers_origin_only_and_is_never_shown() -> None:
    credentials = Credentials("s3cret-token-value")
    base = "https://pub.example:8443"
    assert credentials.headers_for(base + "/vms?limit=1", base) == {
        "Authorization": "Bearer s3cret-token-value"
    }
    assert credentials.headers_for("wss://pub.example:8443/changefeeds", base)
    assert credentials.headers_for("https://other.example:8443/vms", base) == {}
    assert credentials.headers_for("http://pub.example:8443/vms", base) == {}
    assert same_origin("https://pub.example/x", "https://PUB.example:443")
    assert "s3cret" not in repr(credentials) and "s3cret" not in str(credentials)


def test_load_credentials_refuses_conflicts_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidOption, match="token_file"):
        load_credentials(token="a", token_file=tmp_path / "t")
    with pytest.raises(InvalidOption, match="a readable file"):
        load_credentials(token_file=tmp_path / "missing")
    (tmp_path / "t").write_text("file-token\n")
    assert load_credentials(token_file=tmp_path / "t").token == "file-token"


@dataclass
class Tls:
    service: Service
    pki: Pki
    token: str
    """Scopes listen:vm, read:vm, events."""
    narrow: str
    """Scope read:vm only."""
    ops: str
    """Scope stats."""


@pytest.fixture
async def tls(
    tmp_path: Path, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> AsyncIterator[Tls]:
    pki = Pki(tmp_path)
    cert, key = pki.server_files()
    token, narrow, ops = new_token(), new_token(), new_token()
    config = make_config(redis_server.url, auth={"tokens": [
        {"name": "tcns", "sha256": sha256_hex(token), "scopes": ["listen:vm", "read:vm", "events"]},
        {"name": "narrow", "sha256": sha256_hex(narrow), "scopes": ["read:vm"]},
        {"name": "ops", "sha256": sha256_hex(ops), "scopes": ["stats"]},
    ]}, tls={"certFile": str(cert), "keyFile": str(key)})
    with structlog.testing.capture_logs() as logs, logged() as listener_logs:
        async with start_publisher(config) as service:
            yield Tls(service, pki, token, narrow, ops)
    for secret in (token, narrow, ops):
        assert secret not in repr(logs) and secret not in repr(listener_logs)


async def test_a_listener_with_a_token_and_a_ca_file_bootstraps_and_streams(tls: Tls) -> None:
    await tls.service.bucket.commit("vm", "a", ["nic"], {"uuid": "a"})
    async with Listener(tls.service.url, instance="i-1", service="tcns",
                        resources={"vm": ["nic"]}, token=tls.token, cafile=tls.pki.ca_file,
                        config=FAST) as feed:
        events = []
        async with asyncio.timeout(scaled(10)):
            async for event in feed:
                events.append(event)
                if isinstance(event, BootstrapDone):
                    await tls.service.bucket.commit("vm", "b", ["nic"], {"uuid": "b"})
                if isinstance(event, Change):
                    break
        last = events[-1]
        assert isinstance(last, Change) and last.id == "b"
        assert await feed.fetch("vm", "a") == {"uuid": "a"}


async def test_a_listener_reads_its_token_from_the_environment(
    tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHANGEFEED_TOKEN", tls.token)
    async with Listener(tls.service.url, instance="i-2", service="tcns",
                        resources={"vm": ["nic"]}, ssl=tls.pki.client_context(),
                        bootstrap=False, config=FAST) as feed:
        first = asyncio.create_task(anext(feed))
        await eventually(lambda: bool(tls.service.hub.connections), "the listener registered")
        await tls.service.bucket.commit("vm", "c", ["nic"], {"uuid": "c"})
        async with asyncio.timeout(scaled(10)):
            event = await first
        assert isinstance(event, Change) and event.id == "c"


@pytest.mark.parametrize("which", ["none", "unknown", "no listen scope"])
async def test_a_refused_token_is_raised_at_once_not_retried(tls: Tls, which: str) -> None:
    token = {"none": None, "unknown": new_token(), "no listen scope": tls.narrow}[which]
    listener = Listener(tls.service.url, instance="i-3", service="tcns",
                        resources={"vm": ["nic"]}, token=token, cafile=tls.pki.ca_file,
                        config=FAST)
    async with listener:
        with pytest.raises(AccessDenied) as denied:
            async with asyncio.timeout(scaled(10)):
                await listener.__anext__()
    assert denied.value.status == (403 if which == "no listen scope" else 401)
    if token is not None:
        assert token not in str(denied.value)


async def test_a_registration_outside_the_scopes_raises_registration_rejected(tls: Tls) -> None:
    listener = Listener(tls.service.url, instance="i-4", service="tcns",
                        resources={"vm": ["nic"], "network": ["ips"]}, token=tls.token,
                        cafile=tls.pki.ca_file, config=FAST)
    async with listener:
        with pytest.raises(RegistrationRejected) as rejected:
            async with asyncio.timeout(scaled(10)):
                await listener.__anext__()
    assert rejected.value.close_code == 1008 and "network" in rejected.value.reason


async def test_a_pull_consumer_sends_its_token(tls: Tls) -> None:
    cursor = await tls.service.bucket.commit("vm", "a", ["nic"], {"uuid": "a"})
    async with PullConsumer(tls.service.url, resource="vm", token=tls.token,
                            cafile=tls.pki.ca_file) as consumer:
        items = await consumer.fetch(max_messages=1, expires=1)
        assert [item.cursor for item in items] == [cursor]
    async with PullConsumer(tls.service.url, token=tls.narrow, cafile=tls.pki.ca_file) as refused:
        with pytest.raises(AccessDenied) as denied:
            await refused.fetch(max_messages=1, expires=1)
    assert denied.value.status == 403 and denied.value.code == "Forbidden"


async def _run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "changefeed_cli", "--log-format", "json", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    async with asyncio.timeout(scaled(30)):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_changefeed_stats_takes_a_token_file_or_the_environment(
    tls: Tls, tmp_path: Path
) -> None:
    (tmp_path / "ops.token").write_text(tls.ops)
    ca = str(tls.pki.ca_file)
    code, out, err = await _run_cli("stats", tls.service.url, "--json", "--cafile", ca,
                                    "--token-file", str(tmp_path / "ops.token"))
    assert code == 0, err
    assert "registrations" in orjson.loads(out)
    code, out, err = await _run_cli("stats", tls.service.url, "--cafile", ca,
                                    env={"CHANGEFEED_TOKEN": tls.token})
    assert code == 0, err
    assert "registrations not shown" in out
    code, out, err = await _run_cli("stats", tls.service.url, "--cafile", ca)
    assert code == 1 and "HTTP 401" in err
    for secret in (tls.ops, tls.token):
        assert secret not in out + err


async def test_changefeed_snoop_takes_a_token_file_and_refuses_without(
    tls: Tls, tmp_path: Path
) -> None:
    (tmp_path / "t").write_text(tls.narrow)
    code, out, err = await _run_cli("snoop", tls.service.url, "vm", "--cafile",
                                    str(tls.pki.ca_file), "--token-file", str(tmp_path / "t"))
    assert code == 1 and "HTTP 403" in err and tls.narrow not in out + err
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "changefeed_cli", "--log-format", "json", "snoop",
        tls.service.url, "vm", "--cafile", str(tls.pki.ca_file),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "CHANGEFEED_TOKEN": tls.token},
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        async with asyncio.timeout(scaled(15)):
            while b'"event": "registered"' not in await process.stderr.readline():
                pass
            cursor = await tls.service.bucket.commit("vm", "s", ["nic"], {"uuid": "s"})
            line = orjson.loads(await process.stdout.readline())
        assert line["cursor"] == cursor
    finally:
        process.kill()
        out_rest, err_rest = await process.communicate()
    assert tls.token.encode() not in out_rest + err_rest
