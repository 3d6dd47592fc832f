"""The security keys of config.js: every key validated, nothing secret in an error, and the
refusal to serve a public address without auth (in process and from `changefeed serve`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from changefeed.errors import ConfigError
from publisher.config.security import check_exposure, is_loopback
from publisher.config.settings import Config, parse_config
from publisher.security.auth import Authenticator, Denied, Identity, now
from publisher.server.service import Service
from tests.pki import new_token, sha256_hex
from tests.servers import PublisherProcess, RedisServer, scaled, write_config

RESOURCES = (
    'resources: [{resource: "vm", subResources: ["nic"], bootstrapRoute: "/vms"}], '
    'feed: {consumers: ["billing"]}'
)


def parse(text: str) -> Config:
    return parse_config("{" + RESOURCES + ", " + text + "}", base=Path("/etc/changefeed"))


def refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as error:
        parse(text)
    return error.value


def test_the_three_token_sources_and_their_scopes() -> None:
    digest = sha256_hex("x" * 32)
    config = parse(f'''auth: {{tokens: [
        {{name: "tcns", sha256: "{digest}", scopes: ["listen:vm", "read:*"]}},
        {{name: "ops", tokenFile: "ops.token", scopes: ["stats", "admin"]}},
        {{name: "billing", tokenEnv: "BILLING_TOKEN", scopes: ["events", "feed:billing"],
          expires: "2030-01-01T00:00:00Z"}},
    ]}}''')
    auth = config.security.auth
    assert auth is not None and auth.mode == "token" and config.security.authenticating
    tcns, ops, billing = auth.tokens
    assert tcns.sha256 == bytes.fromhex(digest)
    assert ops.token_file == Path("/etc/changefeed/ops.token")
    assert billing.token_env == "BILLING_TOKEN" and billing.expires is not None


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ('auth: {mode: "open"}', "auth.mode", '"token" (the default) or "none"'),
        ("auth: {}", "auth.tokens", "at least one token"),
        ('auth: {mode: "none", tokens: [{name: "a", tokenEnv: "A", scopes: ["events"]}]}',
         "auth.mode", '"token" when tokens'),
        ('auth: {tokens: [{name: "a", scopes: ["events"]}]}', "auth.tokens[0]", "exactly one of"),
        ('auth: {tokens: [{name: "a", tokenEnv: "A", tokenFile: "f", scopes: ["events"]}]}',
         "auth.tokens[0]", "exactly one of"),
        ('auth: {tokens: [{name: "a", tokenEnv: "A", scopes: []}]}',
         "auth.tokens[0].scopes", "a non-empty list of scopes"),
        ('auth: {tokens: [{name: "a", tokenEnv: "A", scopes: ["listen:disk"]}]}',
         "auth.tokens[0].scopes[0]", "a name of resources (vm) or '*'"),
        ('auth: {tokens: [{name: "a", tokenEnv: "A", scopes: ["feed:nobody"]}]}',
         "auth.tokens[0].scopes[0]", "a name of feed.consumers (billing) or '*'"),
        ('auth: {tokens: [{name: "a", tokenEnv: "A", scopes: ["write"]}]}',
         "auth.tokens[0].scopes[0]", "a non-empty list of scopes"),
        ('auth: {tokens: [{name: "a", tokenEnv: "A", scopes: ["events"], expires: "2030-01-01"}]}',
         "auth.tokens[0].expires", "with a time zone"),
        ('auth: {tokens: [{name: "a", tokenEnv: "1X", scopes: ["events"]}]}',
         "auth.tokens[0].tokenEnv", "the name of an environment variable"),
        ('auth: {tokens: [{name: "a", tokenEnv: "A", scopes: ["events"]}, '
         '{name: "a", tokenEnv: "B", scopes: ["events"]}]}',
         "auth.tokens[1].name", "a name not already used at auth.tokens[0]"),
        ('auth: {certificates: [{name: "c", subject: "XX=1", scopes: ["events"]}]}',
         "auth.certificates[0].subject", "a certificate subject"),
        ('tls: {certFile: "a.pem"}', "tls.keyFile", "a PEM file name"),
        ('tls: {certFile: "a", keyFile: "b", requireClientCert: true}',
         "tls.requireClientCert", "false without tls.clientCaFile"),
        ('allowedOrigins: ["https://ok.example", "ops.example.com"]', "allowedOrigins[1]",
         "scheme://host[:port]"),
        ('allowedOrigins: ["https://ok.example/path"]', "allowedOrigins[0]", "scheme://host"),
        ("clientLimits: {requestsPerSecond: -1}", "clientLimits.requestsPerSecond",
         "a positive number"),
        ("clientLimits: {maxListener: 1}", "clientLimits.maxListener", "one of the known keys"),
    ],
)
def test_each_key_is_checked(text: str, key: str, expected: str) -> None:
    error = refused(text)
    assert error.key == key
    assert expected in error.expected


def test_a_token_pasted_where_its_digest_belongs_is_not_shown() -> None:
    secret = new_token()
    for text in (
        f'auth: {{tokens: [{{name: "a", sha256: "{secret}", scopes: ["events"]}}]}}',
        f'auth: {{tokens: [{{name: "a", token: "{secret}", scopes: ["events"]}}]}}',
        f'auth: {{token: "{secret}"}}',
        f'auth: "{secret}"',
    ):
        error = refused(text)
        assert secret not in str(error) and secret not in repr(error.value)


def test_origins_are_kept_as_browsers_send_them() -> None:
    config = parse('allowedOrigins: ["HTTPS://Ops.Example.com:443", "http://[::1]:8080"]')
    assert config.security.allowed_origins == {"https://ops.example.com", "http://[::1]:8080"}


def test_tokens_from_files_and_the_environment_are_read_and_checked(tmp_path: Path) -> None:
    good, short = new_token(), "abc"
    (tmp_path / "good.token").write_text(good + "\n")
    (tmp_path / "short.token").write_text(short)
    config = parse_config("{" + RESOURCES + ''', auth: {tokens: [
        {name: "f", tokenFile: "good.token", scopes: ["events"]},
        {name: "e", tokenEnv: "T", scopes: ["stats"]},
    ]}}''', base=tmp_path)
    auth = Authenticator.build(config.security.auth, {"T": "e" * 20})
    found = auth.authenticate(f"Bearer {good}", None, now())
    assert found == Identity("f", frozenset({"events"}), "token")
    assert isinstance(auth.authenticate("bearer " + "e" * 20, None, now()), Identity)
    assert isinstance(auth.authenticate(f"Bearer {good}x", None, now()), Denied)
    with pytest.raises(ConfigError) as error:
        Authenticator.build(config.security.auth, {})
    assert error.value.key == "auth.tokens[1].tokenEnv"
    bad = parse_config("{" + RESOURCES + ''', auth: {tokens: [
        {name: "f", tokenFile: "short.token", scopes: ["events"]}]}}''', base=tmp_path)
    with pytest.raises(ConfigError) as error:
        Authenticator.build(bad.security.auth, {})
    assert error.value.key == "auth.tokens[0].tokenFile" and short not in str(error.value)


def test_only_loopback_without_auth() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host)
        check_exposure(host, parse("").security)
    for host in ("0.0.0.0", "::", "10.0.0.7", "example.com"):
        with pytest.raises(ConfigError) as error:
            check_exposure(host, parse("").security)
        assert error.value.key == "server.host"
        check_exposure(host, parse('auth: {mode: "none"}').security)
        check_exposure(host, parse('auth: {tokens: [{name: "a", tokenEnv: "A", '
                                   'scopes: ["events"]}]}').security)


def test_the_service_refuses_a_public_address_without_auth(
    make_config: Callable[..., Config],
) -> None:
    config = make_config("redis://127.0.0.1:1/0", server={"host": "0.0.0.0", "port": 0})
    with pytest.raises(ConfigError, match=r"server\.host"):
        Service(config)


def _serve(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "changefeed_cli", "serve", "--config", str(config), *args],
        capture_output=True, text=True, timeout=scaled(30),
    )


def test_serve_on_a_public_address_without_auth_stops_with_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.js", "redis://127.0.0.1:1/0")
    result = _serve(config, "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: config key 'server.host': got '0.0.0.0', expected 127.0.0.1")
    assert 'auth: {mode: "none"}' in line


def test_serve_never_logs_a_token(tmp_path: Path, redis_server: RedisServer) -> None:
    """The whole output of a serve process that was sent good, unknown and expired tokens."""
    good, unknown, expired = new_token(), new_token(), new_token()
    (tmp_path / "ops.token").write_text(good)
    (tmp_path / "ops.token").chmod(0o644)  # readable by others: warned about, by name only
    extra: dict[str, Any] = {"auth": {"tokens": [
        {"name": "ops", "tokenFile": str(tmp_path / "ops.token"), "scopes": ["admin"]},
        {"name": "old", "sha256": sha256_hex(expired), "scopes": ["admin"],
         "expires": "2000-01-01T00:00:00Z"},
    ]}}
    config = write_config(tmp_path / "config.js", redis_server.url, **extra)
    server = PublisherProcess(config, "--port", "0", "--host", "0.0.0.0").start()

    async def requests() -> list[int]:
        statuses = []
        async with aiohttp.ClientSession() as http:
            for token in (good, unknown, expired, "not-even-long"):
                headers = {"Authorization": f"Bearer {token}"}
                async with http.get(server.url + "/vms", headers=headers) as response:
                    statuses.append(response.status)
        return statuses

    try:
        assert asyncio.run(requests()) == [200, 401, 401, 401]
    finally:
        server.stop()
    output = server.output()
    assert "token file readable by other users" in output
    assert "expired token of 'old'" in output and "unknown token" in output
    for token in (good, unknown, expired, "not-even-long"):
        assert token not in output
