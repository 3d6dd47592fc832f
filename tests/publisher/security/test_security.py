"""Authentication, scopes, TLS, mTLS, origins and reload, on a real publisher over real TLS
(certificates made by the test with trustme), with real tokens. Every log line of every test
is captured and searched for the tokens (`no_token_in_logs`)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import structlog
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from changefeed.errors import ConfigError
from publisher.config.settings import Config
from publisher.server.service import Service
from tests.conftest import PublisherFactory
from tests.pki import Pki, new_token, sha256_hex
from tests.servers import RedisServer, scaled
from tests.wsclient import Feed, register, v1, v2

ORIGIN = "https://ops.example.com"
TOKENS: list[str] = []
"""Every token a test of this module made: none may appear in a log line."""


@pytest.fixture(autouse=True)
def no_token_in_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with structlog.testing.capture_logs() as logs:
        yield logs
    text = repr(logs)
    for token in TOKENS:
        assert token not in text, "a token appeared in a log line"


def token() -> str:
    made = new_token()
    TOKENS.append(made)
    return made


@dataclass
class Secure:
    """A publisher over TLS with tokens of every kind of source, and an mTLS identity."""

    service: Service
    pki: Pki
    tokens: dict[str, str]
    """identity name -> its token."""
    token_file: Path
    config_of: Callable[..., Config]

    @property
    def url(self) -> str:
        return self.service.url

    def context(self, common_name: str | None = None) -> ssl.SSLContext:
        return self.pki.client_context(common_name)

    def headers(self, name: str | None) -> dict[str, str]:
        if name is None:
            return {}
        return {"Authorization": f"Bearer {self.tokens.get(name, name)}"}

    async def request(
        self, method: str, path: str, name: str | None, body: Any = None,
        headers: dict[str, str] | None = None, cert: str | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        connector = aiohttp.TCPConnector(ssl=self.context(cert))
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.request(method, self.url + path, headers={**self.headers(name), **(headers or {})},
                         data=None if body is None else orjson.dumps(body)) as response,
        ):
            raw = await response.read()
            return response.status, dict(response.headers), orjson.loads(raw) if raw else None


def auth_section(tokens: dict[str, str], token_file: Path, **extra: Any) -> dict[str, Any]:
    return {
        "tokens": [
            {"name": "tcns", "sha256": sha256_hex(tokens["tcns"]),
             "scopes": ["listen:vm", "read:vm"]},
            {"name": "ops", "tokenFile": str(token_file), "scopes": ["stats", "admin"]},
            {"name": "billing", "tokenEnv": "TEST_BILLING_TOKEN",
             "scopes": ["events", "feed:billing"]},
            {"name": "old", "sha256": sha256_hex(tokens["old"]), "scopes": ["listen:*"],
             "expires": "2001-01-01T00:00:00Z"},
            {"name": "reader", "sha256": sha256_hex(tokens["reader"]), "scopes": ["read:*"],
             "expires": "2999-01-01T00:00:00+00:00"},
        ],
        "certificates": [
            {"name": "certsvc", "subject": "CN=certsvc",
             "scopes": ["listen:network", "read:network"]},
        ],
        **extra,
    }


@pytest.fixture
async def secure(
    tmp_path: Path, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Secure]:
    pki = Pki(tmp_path)
    cert_file, key_file = pki.server_files()
    tokens = {name: token() for name in ("tcns", "ops", "billing", "old", "reader")}
    token_file = tmp_path / "ops.token"
    token_file.write_text(tokens["ops"] + "\n")
    token_file.chmod(0o600)
    monkeypatch.setenv("TEST_BILLING_TOKEN", tokens["billing"])

    def config_of(**overrides: Any) -> Config:
        extra: dict[str, Any] = {
            "auth": auth_section(tokens, token_file),
            "tls": {"certFile": str(cert_file), "keyFile": str(key_file),
                    "clientCaFile": str(pki.ca_file)},
            "allowedOrigins": [ORIGIN],
            "feed": {"consumers": ["billing", "other"]},
        }
        extra.update(overrides)
        return make_config(redis_server.url, **extra)

    async with start_publisher(config_of()) as service:
        assert service.url.startswith("https://127.0.0.1:")
        yield Secure(service, pki, tokens, token_file, config_of)


# --- HTTP: every route, every scope -------------------------------------------------------------

ALLOWED = [
    ("GET", "/changefeeds", "tcns", 200),
    ("GET", "/changefeeds", "billing", 200),
    ("GET", "/vms", "tcns", 200),
    ("GET", "/vms", "reader", 200),
    ("GET", "/vms", "ops", 200),  # admin
    ("GET", "/vms/nope", "tcns", 404),
    ("GET", "/networks", "reader", 200),
    ("GET", "/changefeeds/events?max_results=1&wait_time=0", "billing", 200),
    ("GET", "/changefeeds/feed/v1?n=1&cursor0=_first&pagesizehint=1", "billing", 200),
    ("GET", "/changefeeds/stats", "tcns", 200),
    ("GET", "/nope", "tcns", 404),
]
REFUSED = [
    ("GET", "/vms", "billing"),
    ("GET", "/vms/x", "billing"),
    ("GET", "/networks", "tcns"),
    ("GET", "/networks/x", "tcns"),
    ("GET", "/changefeeds/events", "tcns"),
    ("POST", "/changefeeds/rpc", "tcns"),
    ("GET", "/changefeeds/feed/v1?n=1", "reader"),
]


@pytest.mark.parametrize(("method", "path", "name", "status"), ALLOWED)
async def test_a_scope_opens_its_routes(
    secure: Secure, method: str, path: str, name: str, status: int
) -> None:
    assert (await secure.request(method, path, name))[0] == status


@pytest.mark.parametrize(("method", "path", "name"), REFUSED)
async def test_a_route_outside_the_scopes_is_403(
    secure: Secure, method: str, path: str, name: str
) -> None:
    body_sent: dict[str, Any] | None = {} if method == "POST" else None
    status, _, body = await secure.request(method, path, name, body=body_sent)
    assert status == 403
    assert body["code"] == "Forbidden"
    assert f"identity {name!r} lacks the scope" in body["message"]


async def test_the_rpc_route_takes_the_events_scope(secure: Secure) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "events", "params": {"max_results": 1}}
    status, _, body = await secure.request("POST", "/changefeeds/rpc", "billing", call)
    assert status == 200 and "result" in body


@pytest.mark.parametrize("path", ["/changefeeds", "/vms", "/changefeeds/stats",
                                  "/changefeeds/events", "/nope"])
@pytest.mark.parametrize("credential", [None, "unknown", "old", "Basic"])
async def test_no_valid_token_is_401_with_a_bearer_challenge(
    secure: Secure, path: str, credential: str | None
) -> None:
    headers: dict[str, str] = {}
    if credential == "unknown":
        headers = {"Authorization": f"Bearer {token()}"}
    elif credential == "old":  # expired: refused like an unknown token
        headers = secure.headers("old")
    elif credential == "Basic":
        headers = {"Authorization": "Basic dXNlcjpwYXNz"}
    status, response_headers, body = await secure.request("GET", path, None, headers=headers)
    assert status == 401
    assert body["code"] == "Unauthorized"
    challenge = response_headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer ")
    assert ('error="invalid_token"' in challenge) == (credential is not None)
    if credential in ("unknown", "old"):
        assert body["message"] == "the credentials are not valid"  # the same for both


async def test_expired_and_unknown_tokens_are_logged_with_distinct_reasons(
    secure: Secure, no_token_in_logs: list[MutableMapping[str, Any]]
) -> None:
    unknown = token()
    await secure.request("GET", "/vms", None, headers={"Authorization": f"Bearer {unknown}"})
    await secure.request("GET", "/vms", "old")
    refused = [e for e in no_token_in_logs if e["event"] == "request refused"]
    reasons = [e["reason"] for e in refused]
    assert reasons == ["unknown token", "expired token of 'old'"]
    assert refused[0]["token_hash"] == sha256_hex(unknown)[:8]


async def test_stats_show_registrations_only_to_the_stats_scope(secure: Secure) -> None:
    async with connect(secure.service.ws_url, ssl=secure.context(),
                       additional_headers={"Accept-Version": "~1", **secure.headers("tcns")}) as ws:
        await ws.send(orjson.dumps(v1("vm", ["nic"])).decode())
        await ws.recv()
        _, _, counts = await secure.request("GET", "/changefeeds/stats", "tcns")
        assert counts["listeners"] == 1 and "registrations" not in counts
        _, _, full = await secure.request("GET", "/changefeeds/stats", "ops")
        assert full["listeners"] == 1
        assert full["registrations"][0]["remote"] == "127.0.0.1"
        assert full["refused"] == {"TooManyConnections": 0}


async def test_feed_cursors_are_stored_only_for_the_consumer_of_the_scope(secure: Secure) -> None:
    query = "/changefeeds/feed/v1?n=1&cursor0=_first&pagesizehint=1&cursorset=c1&consumer="
    assert (await secure.request("GET", query + "billing", "billing"))[0] == 200
    status, _, body = await secure.request("GET", query + "other", "billing")
    assert status == 403 and body["code"] == "Forbidden" and "feed:other" in body["message"]
    assert (await secure.request("GET", query + "other", "ops"))[0] == 200  # admin


# --- websockets -----------------------------------------------------------------------------


async def _upgrade_status(secure: Secure, headers: dict[str, str], **kwargs: Any) -> int:
    kwargs.setdefault("ssl", secure.context())
    with pytest.raises(InvalidStatus) as refused:
        async with connect(secure.service.ws_url,
                           additional_headers={"Accept-Version": "~1", **headers}, **kwargs):
            pass
    return refused.value.response.status_code


async def test_an_upgrade_without_a_valid_token_is_401_before_any_upgrade(secure: Secure) -> None:
    assert await _upgrade_status(secure, {}) == 401
    assert await _upgrade_status(secure, {"Authorization": f"Bearer {token()}"}) == 401
    assert await _upgrade_status(secure, secure.headers("old")) == 401
    assert await _upgrade_status(secure, secure.headers("billing")) == 403  # no listen: scope
    assert secure.service.hub.connections == set()


async def _register(
    secure: Secure, frame: dict[str, Any], version: str, headers: dict[str, str],
    cert: str | None = None,
) -> tuple[int, str] | dict[str, Any]:
    """The reply to a registration, or the close code and reason refusing it."""
    async with connect(secure.service.ws_url, ssl=secure.context(cert),
                       additional_headers={"Accept-Version": version, **headers}) as ws:
        await ws.send(orjson.dumps(frame).decode())
        try:
            reply: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
            return reply
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code, closed.rcvd.reason


async def test_registration_outside_the_scopes_is_closed_with_1008_naming_the_resource(
    secure: Secure,
) -> None:
    tcns = secure.headers("tcns")
    reply = await _register(secure, v1("vm", ["nic"]), "~1", tcns)
    assert isinstance(reply, dict) and "cursor" in reply
    refused = await _register(secure, v1("network", ["ips"]), "~1", tcns)
    assert refused == (1008, "not authorized to listen for network: identity 'tcns' lacks "
                             "listen:network")
    # Several resources, one outside the scopes: the registration is refused whole.
    both = await _register(secure, v2({"vm": ["nic"], "network": ["ips"]}), "~2", tcns)
    assert isinstance(both, tuple) and both[0] == 1008 and "network" in both[1]
    assert secure.service.hub.connections == set()


async def test_a_client_certificate_is_an_identity(secure: Secure) -> None:
    """mTLS: the certificate's subject names the identity; no token needed."""
    reply = await _register(secure, v1("network", ["ips"]), "~1", {}, cert="certsvc")
    assert isinstance(reply, dict) and "cursor" in reply
    refused = await _register(secure, v1("vm", ["nic"]), "~1", {}, cert="certsvc")
    assert isinstance(refused, tuple) and refused[0] == 1008 and "vm" in refused[1]
    assert (await secure.request("GET", "/networks", None, cert="certsvc"))[0] == 200
    assert (await secure.request("GET", "/vms", None, cert="certsvc"))[0] == 403
    # A certificate of the CA whose subject is no identity: 401.
    assert (await secure.request("GET", "/networks", None, cert="stranger"))[0] == 401


async def test_a_certificate_of_another_ca_fails_the_handshake(secure: Secure) -> None:
    other = Pki(secure.pki.directory / "other")
    other.directory.mkdir()
    context = secure.context()
    other.ca.issue_cert("x.example", common_name="certsvc").configure_cert(context)
    connector = aiohttp.TCPConnector(ssl=context)
    async with aiohttp.ClientSession(connector=connector) as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.get(secure.url + "/networks") as response:
                await response.read()


async def test_plain_http_to_the_tls_port_gets_no_answer(secure: Secure) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.get(secure.url.replace("https://", "http://") + "/vms",
                                headers=secure.headers("tcns")) as response:
                await response.read()


# --- origins --------------------------------------------------------------------------------


async def test_a_websocket_from_another_origin_is_403(secure: Secure) -> None:
    tcns = secure.headers("tcns")
    assert await _upgrade_status(secure, tcns, origin="https://evil.example") == 403
    reply = await _register(secure, v1("vm", ["nic"]), "~1", {**tcns, "Origin": ORIGIN})
    assert isinstance(reply, dict) and "cursor" in reply


async def test_cors_requests_of_an_allowed_origin_are_answered_and_others_refused(
    secure: Secure,
) -> None:
    status, headers, _ = await secure.request("GET", "/vms", "tcns", headers={"Origin": ORIGIN})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ORIGIN
    status, headers, body = await secure.request(
        "GET", "/vms", "tcns", headers={"Origin": "https://evil.example"}
    )
    assert status == 403 and body["code"] == "OriginNotAllowed"
    assert "Access-Control-Allow-Origin" not in headers
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "GET",
                 "Access-Control-Request-Headers": "authorization"}
    status, headers, _ = await secure.request("OPTIONS", "/vms", None, headers=preflight)
    assert status == 204 and "Authorization" in headers["Access-Control-Allow-Headers"]
    status, _, _ = await secure.request(
        "OPTIONS", "/vms", None, headers={**preflight, "Origin": "https://evil.example"}
    )
    assert status == 403


# --- reload -------------------------------------------------------------------------------


async def _peer_serial(url: str, context: ssl.SSLContext) -> int:
    host, port = url.removeprefix("https://").split(":")
    _, writer = await asyncio.open_connection(host, int(port), ssl=context)
    try:
        cert = writer.get_extra_info("ssl_object").getpeercert()
        return int(cert["serialNumber"], 16)
    finally:
        writer.close()


async def test_reload_picks_up_new_tokens_and_certificates_without_dropping_listeners(
    secure: Secure, monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = secure.service
    before = await _peer_serial(secure.url, secure.context())
    async with connect(service.ws_url, ssl=secure.context(),
                       additional_headers={"Accept-Version": "~1", **secure.headers("tcns")}) as ws:
        await ws.send(orjson.dumps(v1("vm", ["nic"])).decode())
        await ws.recv()
        # Rotate: a new ops token in its file, a new billing token in the environment, a new
        # server certificate.
        old_ops = secure.tokens["ops"]
        secure.tokens["ops"] = token()
        secure.token_file.write_text(secure.tokens["ops"])
        secure.tokens["billing"] = token()
        monkeypatch.setenv("TEST_BILLING_TOKEN", secure.tokens["billing"])
        secure.pki.server_files()
        service.reload_security(secure.config_of())

        assert (await secure.request("GET", "/changefeeds/stats", old_ops))[0] == 401
        assert (await secure.request("GET", "/changefeeds/stats", "ops"))[0] == 200
        assert (await secure.request("GET", "/changefeeds/events", "billing"))[0] == 200
        assert await _peer_serial(secure.url, secure.context()) != before
        # The listener registered before the reload still gets changes.
        await service.bucket.publish("vm", "v1", ["nic"])
        item = orjson.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
        assert item["changedResourceId"] == "v1"


async def test_a_bad_reload_changes_nothing(secure: Secure, tmp_path: Path) -> None:
    service = secure.service
    missing = tmp_path / "missing.token"
    bad = secure.config_of(auth={"tokens": [
        {"name": "ops", "tokenFile": str(missing), "scopes": ["admin"]}]})
    with pytest.raises(ConfigError) as error:
        service.reload_security(bad)
    assert error.value.key == "auth.tokens[0].tokenFile"
    no_tls = secure.config_of(tls=None)
    with pytest.raises(ConfigError, match="restart"):
        service.reload_security(no_tls)
    assert (await secure.request("GET", "/changefeeds/stats", "ops"))[0] == 200


async def test_reload_removing_auth_on_a_public_address_is_refused(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, tmp_path: Path,
) -> None:
    tokens = {name: token() for name in ("tcns", "old", "reader")}
    ops_file = tmp_path / "ops.token"
    ops_file.write_text(token())
    config = make_config(redis_server.url, server={"host": "0.0.0.0", "port": 0},
                         auth={"tokens": auth_section(tokens, ops_file)["tokens"][:2]})
    async with start_publisher(config) as service:
        with pytest.raises(ConfigError) as error:
            service.reload_security(make_config(redis_server.url))
        assert error.value.key == "server.host"
        async with aiohttp.ClientSession() as http, http.get(service.url + "/vms") as response:
            assert response.status == 401


async def test_mode_none_serves_listeners_without_tokens_on_any_address(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    """Triton's listeners send no token: with auth: {mode: "none"} they keep working."""
    config = make_config(redis_server.url, server={"host": "0.0.0.0", "port": 0},
                         auth={"mode": "none"})
    async with start_publisher(config) as service:
        url = service.ws_url.replace("0.0.0.0", "127.0.0.1")
        feed = await register(url, v1("vm", ["nic"]))
        assert "cursor" in feed.reply
        await feed.close()
        async with aiohttp.ClientSession() as http, http.get(
            service.url.replace("0.0.0.0", "127.0.0.1") + "/changefeeds/stats",
            headers={"Host": "publisher.example"},
        ) as response:
            assert response.status == 200
            assert "registrations" in await response.json()


# --- revocation ---------------------------------------------------------------------------


async def _closed_with(feed: Feed) -> tuple[int, str]:
    """The close code and reason the publisher closes `feed` with (no item may come first)."""
    try:
        frame = await asyncio.wait_for(feed.ws.recv(), scaled(5))
    except ConnectionClosed as closed:
        assert closed.rcvd is not None, "closed without a close frame"
        return closed.rcvd.code, closed.rcvd.reason
    raise AssertionError(f"still open, got {frame!r}")


async def test_a_reload_closes_the_listeners_whose_identity_it_revoked_not_those_it_rotated(
    secure: Secure,
) -> None:
    """A removed token identity, and a certificate identity that lost its listen scope: their
    listeners are closed with 1008 naming the identity. An identity whose token was rotated (a
    new token, the same name) keeps its listener streaming: a reload drops no established
    listener of an identity it still authorizes."""
    service = secure.service
    revoked = await register(service.ws_url, v1("vm", ["nic"]), ssl=secure.context(),
                             headers=secure.headers("tcns"))
    certified = await register(service.ws_url, v1("network", ["ips"]),
                               ssl=secure.context("certsvc"))
    rotated = await register(service.ws_url, v1("vm", ["nic"]), ssl=secure.context(),
                             headers=secure.headers("ops"))
    assert len(service.hub.connections) == 3
    old_tcns = secure.tokens["tcns"]
    secure.tokens["ops"] = token()
    secure.token_file.write_text(secure.tokens["ops"])
    auth = auth_section(secure.tokens, secure.token_file)
    auth["tokens"] = [t for t in auth["tokens"] if t["name"] != "tcns"]
    auth["certificates"][0]["scopes"] = ["read:network"]
    service.reload_security(secure.config_of(auth=auth))

    code, reason = await _closed_with(revoked)
    assert code == 1008 and reason == "credentials no longer valid: token 'tcns' removed"
    code, reason = await _closed_with(certified)
    assert code == 1008 and reason == (
        "credentials no longer valid: identity 'certsvc' lacks listen:network")
    await service.bucket.publish("vm", "v1", ["nic"])
    assert (await rotated.next())["changedResourceId"] == "v1"
    assert len(service.hub.connections) == 1
    assert service.hub.counters.closed["credentialsRevoked"] == 2
    assert (await secure.request("GET", "/vms", old_tcns))[0] == 401
    await rotated.close()


async def test_a_listener_is_closed_when_its_token_expires(
    redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory,
) -> None:
    soon = token()
    expires = datetime.now(UTC) + timedelta(seconds=scaled(1.5))
    config = make_config(redis_server.url, auth={"tokens": [
        {"name": "soon", "sha256": sha256_hex(soon), "scopes": ["listen:vm"],
         "expires": expires.isoformat()}]})
    async with start_publisher(config) as service:
        feed = await register(service.ws_url, v1("vm", ["nic"]),
                              headers={"Authorization": f"Bearer {soon}"})
        assert "cursor" in feed.reply
        try:
            frame = await asyncio.wait_for(feed.ws.recv(), scaled(10))
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            assert (closed.rcvd.code, closed.rcvd.reason) == (
                1008, "credentials no longer valid: expired token 'soon'")
        else:
            raise AssertionError(f"still open, got {frame!r}")
        assert datetime.now(UTC) >= expires
        assert service.hub.connections == set()
