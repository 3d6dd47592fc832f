"""Signed tokens for browsers (auth.jwt) on a real publisher: HS256 with a shared secret,
RS256 and EdDSA from a JWKS file and from a JWKS URL (refreshed), carried by a
`changefeed.bearer.<token>` subprotocol or an `access_token` parameter on the upgrade and on SSE;
refusals (signature, audience, issuer, scope, exp) with the documented codes; a listener closed
when its token's `exp` passes; and no token text in any log line (structlog, and aiohttp's own
loggers: the handshake's subprotocol warning and the access and server logs)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import orjson
import pytest
import structlog
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from jwt.algorithms import OKPAlgorithm, RSAAlgorithm
from structlog.testing import capture_logs
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from changefeed.errors import ConfigError
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.servers import RedisServer, scaled
from tests.wsclient import v1

SECRET = "an-hs256-secret-of-more-than-32-bytes-0123456789"
AUDIENCE = "changefeed-test"
ISSUER = "https://app.example"
TOKENS: list[str] = []
"""Every token minted here: none may appear in a log line."""


@pytest.fixture(autouse=True)
def no_token_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as logs:
        yield
    # The publisher's side: structlog and the standard loggers (aiohttp.websocket,
    # aiohttp.access, aiohttp.server...), not the test's own websockets client.
    text = repr(logs) + "\n".join(
        f"{record.name} {record.getMessage()}" for record in caplog.records
        if not record.name.startswith("websockets.client")
    )
    for token in TOKENS:
        for part in token.split("."):  # not even a segment of it
            assert part not in text, f"token text in a log line:\n{text[-3000:]}"


def mint(key: Any, algorithm: str = "HS256", *, sub: str = "alice",
         scope: str | list[str] = "listen:vm read:vm", audience: str = AUDIENCE,
         issuer: str = ISSUER, lifetime: float = 300, kid: str | None = None,
         **claims: Any) -> str:
    now = int(time.time())
    payload = {"sub": sub, "aud": audience, "iss": issuer, "iat": now, "exp": now + lifetime,
               "scope": scope, **claims}
    token = jwt.encode(payload, key, algorithm=algorithm,
                       headers=None if kid is None else {"kid": kid})
    TOKENS.append(token)
    return token


def jwk(private: Any, kid: str, algorithm: str) -> dict[str, Any]:
    public = private.public_key()
    codec = RSAAlgorithm if algorithm == "RS256" else OKPAlgorithm
    entry: dict[str, Any] = json.loads(codec.to_jwk(public))
    return {**entry, "kid": kid, "alg": algorithm, "use": "sig"}


def jwt_config(**jwt_section: Any) -> dict[str, Any]:
    return {"auth": {"jwt": {"audience": AUDIENCE, "issuer": ISSUER, **jwt_section}}}


@pytest.fixture
async def hs256(
    tmp_path: Path, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> AsyncIterator[Service]:
    secret = tmp_path / "jwt.secret"
    secret.write_text(SECRET)
    async with start_publisher(make_config(
        redis_server.url, **jwt_config(secretFile=str(secret))
    )) as service:
        yield service


async def upgrade(service: Service, *, protocols: list[str] | None = None,
                  query: str = "") -> tuple[Any, dict[str, Any]]:
    """Open and register (v1, vm nic); the socket and its registration reply."""
    ws = await connect(service.ws_url + query, subprotocols=protocols,  # type: ignore[arg-type]
                       additional_headers={"Accept-Version": "~1"})
    await ws.send(orjson.dumps(v1("vm", ["nic"])).decode())
    reply = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
    return ws, reply


async def assert_registers(service: Service, token: str) -> None:
    """A websocket registration with `token` as access_token is answered with a cursor."""
    ws, reply = await upgrade(service, query=f"?access_token={token}")
    await ws.close()
    assert "cursor" in reply


async def status_of(service: Service, **kwargs: Any) -> int:
    with pytest.raises(InvalidStatus) as refused:
        await upgrade(service, **kwargs)
    return refused.value.response.status_code


async def test_hs256_by_subprotocol_registers_and_the_plain_protocol_is_selected(
    hs256: Service,
) -> None:
    token = mint(SECRET)
    ws, reply = await upgrade(hs256, protocols=["changefeed", f"changefeed.bearer.{token}"])
    try:
        assert "cursor" in reply
        assert ws.subprotocol == "changefeed"  # the token is never echoed back
        cursor = await hs256.bucket.commit("vm", "vm-1", ["nic"], {"id": "vm-1"})
        item = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
        assert item["cursor"] == cursor
        registration = hs256.hub.connections.copy().pop()
        assert registration.identity is not None and registration.identity.name == "jwt:alice"
    finally:
        await ws.close()


async def test_a_token_offered_as_the_only_subprotocol_is_selected_without_a_warning(
    hs256: Service, caplog: pytest.LogCaptureFixture,
) -> None:
    token = mint(SECRET)
    ws, reply = await upgrade(hs256, protocols=[f"changefeed.bearer.{token}"])
    await ws.close()
    assert "cursor" in reply
    assert not [r for r in caplog.records if r.name == "aiohttp.websocket"]


async def test_hs256_by_access_token_on_the_upgrade_and_on_sse(hs256: Service) -> None:
    token = mint(SECRET)
    ws, reply = await upgrade(hs256, query=f"?access_token={token}")
    await ws.close()
    assert "cursor" in reply
    url = f"{hs256.url}/changefeeds/sse?resource=vm&sub=nic&access_token={token}"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), scaled(5))
        assert b"event: registered" in first
        cursor = await hs256.bucket.commit("vm", "vm-2", ["nic"], {"id": "vm-2"})
        change = await asyncio.wait_for(response.content.readuntil(b"\n\n"), scaled(5))
        assert b"event: change" in change and cursor.encode() in change


@pytest.mark.parametrize("case", [
    "wrong signature", "other audience", "other issuer", "expired", "no exp", "unknown scope",
    "config token in the query",
])
async def test_refused_tokens_are_401_before_the_upgrade(hs256: Service, case: str) -> None:
    tokens = {
        "wrong signature": lambda: mint("another-secret-of-more-than-32-bytes-abcdefghij"),
        "other audience": lambda: mint(SECRET, audience="someone-else"),
        "other issuer": lambda: mint(SECRET, issuer="https://evil.example"),
        "expired": lambda: mint(SECRET, lifetime=-5),
        "no exp": lambda: _no_exp(),
        "unknown scope": lambda: mint(SECRET, scope="listen:disk"),
        "config token in the query": lambda: _plain(),
    }
    token = tokens[case]()
    assert await status_of(hs256, query=f"?access_token={token}") == 401
    assert await status_of(hs256, protocols=["changefeed", f"changefeed.bearer.{token}"]) == 401
    url = f"{hs256.url}/changefeeds/sse?resource=vm&sub=nic&access_token={token}"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 401
        body = await response.text()
    assert token not in body and "refused" not in body  # the client is told little
    assert hs256.hub.connections == set()


def _no_exp() -> str:
    token = jwt.encode({"sub": "alice", "aud": AUDIENCE, "iss": ISSUER, "scope": "listen:vm"},
                       SECRET, algorithm="HS256")
    TOKENS.append(token)
    return token


def _plain() -> str:
    TOKENS.append("a-config-js-style-token-0123456789")
    return TOKENS[-1]


async def test_a_token_without_the_scope_is_403_or_1008_naming_the_resource(
    hs256: Service,
) -> None:
    no_listen = mint(SECRET, scope="read:vm")
    assert await status_of(hs256, query=f"?access_token={no_listen}") == 403
    network_only = mint(SECRET, scope=["listen:network"])
    ws = await connect(hs256.ws_url + f"?access_token={network_only}",
                       additional_headers={"Accept-Version": "~1"})
    await ws.send(orjson.dumps(v1("vm", ["nic"])).decode())
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), scaled(5))
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
        1008, "not authorized to listen for vm: identity 'jwt:alice' lacks listen:vm")


async def test_a_jwt_in_the_authorization_header_is_accepted_too(hs256: Service) -> None:
    token = mint(SECRET)
    async with aiohttp.ClientSession() as http, http.get(
        f"{hs256.url}/vms", headers={"Authorization": f"Bearer {token}"}
    ) as response:
        assert response.status == 200


async def test_an_established_listener_is_closed_when_its_token_expires(hs256: Service) -> None:
    token = mint(SECRET, lifetime=2)
    ws, reply = await upgrade(hs256, protocols=["changefeed", f"changefeed.bearer.{token}"])
    assert "cursor" in reply
    started = time.monotonic()
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), scaled(10))
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
        1008, "credentials no longer valid: expired token of 'jwt:alice'")
    assert time.monotonic() - started < scaled(4)
    assert hs256.hub.connections == set()


@pytest.mark.parametrize("algorithm", ["RS256", "EdDSA"])
async def test_public_keys_from_a_jwks_file(
    tmp_path: Path, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, algorithm: str,
) -> None:
    private: Any = (rsa.generate_private_key(public_exponent=65537, key_size=2048)
                    if algorithm == "RS256" else ed25519.Ed25519PrivateKey.generate())
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk(private, "k1", algorithm)]}))
    config = make_config(redis_server.url, **jwt_config(jwksFile=str(jwks),
                                                        algorithms=[algorithm]))
    async with start_publisher(config) as service:
        ws, reply = await upgrade(
            service, query=f"?access_token={mint(private, algorithm, kid='k1')}")
        await ws.close()
        assert "cursor" in reply
        other: Any = (rsa.generate_private_key(public_exponent=65537, key_size=2048)
                      if algorithm == "RS256" else ed25519.Ed25519PrivateKey.generate())
        forged = mint(other, algorithm, kid="k1")
        assert await status_of(service, query=f"?access_token={forged}") == 401
        hs = mint(SECRET)  # an HS256 token against public keys: refused, never a key confusion
        assert await status_of(service, query=f"?access_token={hs}") == 401


@contextlib.asynccontextmanager
async def serving_jwks(served: dict[str, Any]) -> AsyncIterator[tuple[str, web.AppRunner]]:
    """An HTTP server of `served` (read at each request) at the URL it yields, with its runner
    (cleaned up at the end, or before by a test that takes the JWKS away)."""

    async def keys(request: web.Request) -> web.Response:
        return web.json_response(served)

    app = web.Application()
    app.router.add_get("/jwks.json", keys)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/jwks.json", runner
    finally:
        await runner.cleanup()


async def test_a_jwks_url_is_read_again_and_picks_up_a_new_key(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    one = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    two = ed25519.Ed25519PrivateKey.generate()
    served = {"keys": [jwk(one, "one", "RS256")]}
    async with serving_jwks(served) as (url, _):
        config = make_config(redis_server.url, **jwt_config(jwksUrl=url, refresh=1))
        async with start_publisher(config) as service:
            first = mint(one, "RS256", kid="one")
            await assert_registers(service, first)
            new = mint(two, "EdDSA", kid="two")
            assert await status_of(service, query=f"?access_token={new}") == 401
            served["keys"].append(jwk(two, "two", "EdDSA"))
            deadline = time.monotonic() + scaled(10)
            while True:
                try:
                    ws, reply = await upgrade(service, query=f"?access_token={new}")
                    await ws.close()
                    break
                except InvalidStatus:
                    assert time.monotonic() < deadline, "the new key was never picked up"
                    await asyncio.sleep(0.2)
            assert "cursor" in reply


async def test_a_reloaded_or_stopped_publisher_stops_refreshing_its_old_jwks(
    tmp_path: Path, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """The JWKS refresher is a thread: a reload's replaced verifier and a stopped publisher end
    theirs at once, rather than when the verifier happens to be garbage-collected (it went on
    reading a JWKS URL long gone, and logging that it could not)."""
    private = ed25519.Ed25519PrivateKey.generate()
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk(private, "k1", "EdDSA")]}))
    config = make_config(redis_server.url, **jwt_config(jwksFile=str(jwks), refresh=60))

    def refresher(service: Service) -> threading.Thread:
        verifier = service.access.authenticator._jwt
        assert verifier is not None and verifier.refresher is not None
        return verifier.refresher

    async with start_publisher(config) as service:
        first = refresher(service)
        assert first.is_alive()
        service.reload_security(config)  # SIGHUP: a new verifier
        second = refresher(service)
        assert second is not first and second.is_alive()
        first.join(scaled(5))
        assert not first.is_alive(), "the replaced verifier's thread ended"
        await assert_registers(service, mint(private, "EdDSA", kid="k1"))
    second.join(scaled(5))
    assert not second.is_alive(), "the stopped publisher's thread ended"


async def test_a_jwks_url_gone_after_start_keeps_the_keys_read_before(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """The JWKS server goes away while the publisher runs: each refresh fails and says so (a
    warning naming the URL's key, no key material), the keys read before still verify their
    tokens, and a token naming a kid the publisher never read is refused (401), not let in."""
    one = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    served = {"keys": [jwk(one, "one", "RS256")]}
    async with serving_jwks(served) as (url, runner):
        config = make_config(redis_server.url, **jwt_config(jwksUrl=url, refresh=1))
        async with start_publisher(config) as service:
            token = mint(one, "RS256", kid="one")
            await assert_registers(service, token)
            with capture_logs() as logs:
                await runner.cleanup()  # the JWKS URL refuses connections from now on
                deadline = time.monotonic() + scaled(10)
                while not any(e["event"].startswith("jwks not refreshed") for e in logs):
                    assert time.monotonic() < deadline, "no refresh was tried"
                    await asyncio.sleep(0.1)  # the refresher's thread: nothing to await
            failed = next(e for e in logs if e["event"].startswith("jwks not refreshed"))
            assert "auth.jwt.jwksUrl" in failed["error"], failed
            await assert_registers(service, token)  # the key read before still verifies
            other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            unknown = mint(other, "RS256", kid="three")
            assert await status_of(service, query=f"?access_token={unknown}") == 401


@pytest.mark.parametrize(("section", "key", "expected"), [
    ({"audience": AUDIENCE}, "auth.jwt", "exactly one of secretFile, secretEnv, jwksFile, jwksUrl"),
    ({"secretEnv": "X", "jwksFile": "k.json", "audience": AUDIENCE}, "auth.jwt", "exactly one"),
    ({"secretEnv": "X"}, "auth.jwt.audience", "aud"),
    ({"secretEnv": "X", "audience": AUDIENCE, "algorithms": ["RS256"]}, "auth.jwt.algorithms",
     "HS256"),
    ({"jwksUrl": "http://example.com/jwks", "audience": AUDIENCE}, "auth.jwt.jwksUrl", "https://"),
    ({"secretEnv": "X", "audience": AUDIENCE, "refresh": 0}, "auth.jwt.refresh", "seconds"),
    ({"secretEnv": "X", "audience": AUDIENCE, "secret": "s"}, "auth.jwt.secret", "known keys"),
])
def test_a_bad_jwt_section_names_the_key_and_what_was_expected(
    make_config: Callable[..., Config], section: dict[str, Any], key: str, expected: str,
) -> None:
    with pytest.raises(ConfigError) as error:
        make_config(None, auth={"jwt": section})
    assert error.value.key == key and expected in str(error.value)


async def test_a_short_or_missing_secret_is_refused_at_start(
    tmp_path: Path, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_JWT_SECRET", "short")
    config = make_config(redis_server.url, **jwt_config(secretEnv="TEST_JWT_SECRET"))
    with pytest.raises(ConfigError) as error:
        async with start_publisher(config):
            pass
    assert error.value.key == "auth.jwt.secretEnv" and "short" not in str(error.value)


async def test_an_sse_stream_for_an_allowed_origin_carries_the_cors_headers(
    tmp_path: Path, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """EventSource on another origin needs Access-Control-Allow-Origin on the stream itself,
    which its handler prepares (the middleware cannot add headers to it afterwards)."""
    secret = tmp_path / "jwt.secret"
    secret.write_text(SECRET)
    page = "http://127.0.0.1:9"
    config = make_config(redis_server.url, allowedOrigins=[page],
                         **jwt_config(secretFile=str(secret)))
    async with start_publisher(config) as service:
        url = f"{service.url}/changefeeds/sse?resource=vm&sub=nic&access_token={mint(SECRET)}"
        async with aiohttp.ClientSession() as http, http.get(
            url, headers={"Origin": page}
        ) as response:
            assert response.status == 200
            assert response.headers["Access-Control-Allow-Origin"] == page


async def test_an_sse_stream_is_closed_when_its_token_expires(hs256: Service) -> None:
    token = mint(SECRET, lifetime=2)
    url = f"{hs256.url}/changefeeds/sse?resource=vm&sub=nic&access_token={token}"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        body = await asyncio.wait_for(response.content.read(), scaled(10))  # to the end
    events = body.decode().split("\n\n")
    assert events[0].splitlines()[1] == "event: registered"
    closing = next(e for e in events if "event: close" in e)
    data = orjson.loads(closing.split("data: ", 1)[1])
    assert data == {"code": 1008,
                    "reason": "credentials no longer valid: expired token of 'jwt:alice'"}
    assert hs256.hub.connections == set()


async def test_no_token_text_in_the_metrics(
    tmp_path: Path, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    secret = tmp_path / "jwt.secret"
    secret.write_text(SECRET)
    config = make_config(redis_server.url, auth={
        "jwt": {"secretFile": str(secret), "audience": AUDIENCE, "issuer": ISSUER},
        "tokens": [{"name": "ops", "sha256": "0" * 64, "scopes": ["admin"]}],
    })
    async with start_publisher(config) as service:
        good, bad = mint(SECRET), mint(SECRET, audience="other")
        ws, _ = await upgrade(service, query=f"?access_token={good}")
        await ws.close()
        assert await status_of(service, query=f"?access_token={bad}") == 401
        admin = mint(SECRET, scope="admin")
        async with aiohttp.ClientSession() as http, http.get(
            f"{service.url}/metrics", headers={"Authorization": f"Bearer {admin}"}
        ) as response:
            assert response.status == 200
            text = await response.text()
    assert "changefeed_" in text
    for token in (good, bad, admin):
        for part in token.split(".")[1:]:
            assert part not in text
