"""The security keys of config.js: `auth`, `tls`, `allowedOrigins` and `clientLimits`.

`parse_security` builds them into a frozen `Security` for
`publisher.config.settings.parse_config`. Pure code: token files and environment variables are
only named here; the service reads them when it builds its
`publisher.security.auth.Authenticator` (at start and on every reload), and the TLS files when
it builds its context (`publisher.security.tls`).

Nothing secret is ever put into an error: a wrong value under `auth` is shown as `<not shown>`
(someone may have pasted a token where its digest belongs). docs/security.md describes every key.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from changefeed import configjs as cj
from changefeed.errors import ConfigError
from publisher.config.jwt import JwtConfig, parse_jwt
from publisher.config.scopes import parse_scopes

NOT_SHOWN = "<not shown>"
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SUBJECT_KEYS = {
    "CN": "commonName",
    "O": "organizationName",
    "OU": "organizationalUnitName",
    "C": "countryName",
    "ST": "stateOrProvinceName",
    "L": "localityName",
    "emailAddress": "emailAddress",
}
"""The attributes a certificate subject in `auth.certificates` may name, as Python's
`SSLSocket.getpeercert()` calls them."""
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One identity that presents a bearer token; exactly one of the three sources is set."""

    name: str
    scopes: frozenset[str]
    key: str
    """Where it is in config.js (`auth.tokens[0]`), for errors."""
    sha256: bytes | None = None
    token_file: Path | None = None
    token_env: str | None = None
    expires: datetime | None = None


@dataclass(frozen=True, slots=True)
class CertificateEntry:
    """One identity that presents a client certificate whose subject holds `subject`."""

    name: str
    subject: tuple[tuple[str, str], ...]
    """(attribute, value) pairs, e.g. (("commonName", "tcns"),), all of which must match."""
    scopes: frozenset[str]
    expires: datetime | None = None


@dataclass(frozen=True, slots=True)
class Auth:
    mode: Literal["token", "none"] = "token"
    """"token": every request needs an identity; "none": anyone may do anything (explicitly)."""
    tokens: tuple[TokenEntry, ...] = ()
    certificates: tuple[CertificateEntry, ...] = ()
    jwt: JwtConfig | None = None
    """Signed tokens (JWT) for browsers: publisher.config.jwt."""


@dataclass(frozen=True, slots=True)
class Tls:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    """Client certificates signed by it are verified (and may be identities in auth)."""
    require_client_cert: bool = False


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Per-client-address token buckets and the global listener cap; None: no limit."""

    requests_per_second: float | None = None
    request_burst: int | None = None
    """Requests one address may make at once (None: twice the rate, at least 1)."""
    registrations_per_second: float | None = None
    registration_burst: int | None = None
    max_listeners: int | None = None


@dataclass(frozen=True, slots=True)
class Security:
    auth: Auth | None = None
    """None: no auth section, so no authentication and a loopback address only."""
    tls: Tls | None = None
    allowed_origins: frozenset[str] = frozenset()
    """Browser origins (`https://host[:port]`) whose requests and websockets are accepted."""
    client_limits: ClientLimits = field(default_factory=ClientLimits)

    @property
    def authenticating(self) -> bool:
        return self.auth is not None and self.auth.mode == "token"


def parse_security(
    obj: dict[str, Any], resources: Collection[str], consumers: Collection[str], base: Path
) -> Security:
    """The security keys of the top-level object `obj` of a config.js; relative file names are
    taken relative to `base` (the config file's directory)."""
    return Security(
        auth=None if "auth" not in obj else _auth(obj["auth"], resources, consumers, base),
        tls=None if obj.get("tls") is None else _tls(obj["tls"], base),
        allowed_origins=cj.get(obj, "", "allowedOrigins", frozenset(), _origins),
        client_limits=_client_limits(obj.get("clientLimits", {})),
    )


SECURITY_KEYS = frozenset({"auth", "tls", "allowedOrigins", "clientLimits"})


def is_loopback(host: str) -> bool:
    """True for a host that only this machine can reach: 127.0.0.0/8, ::1, localhost."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, security: Security) -> None:
    """Refuse to serve on a non-loopback address without an `auth` section (ConfigError)."""
    if security.auth is None and not is_loopback(host):
        raise ConfigError(
            "server.host",
            host,
            "127.0.0.1, ::1 or localhost without an auth section: add auth.tokens "
            "(docs/security.md), or auth: {mode: \"none\"} to serve without authentication",
        )


# --- auth -------------------------------------------------------------------------------------


def _only_masked(obj: dict[str, Any], prefix: str, allowed: set[str]) -> None:
    """`changefeed.configjs.only` without showing the value (it may be a token)."""
    for key in obj:
        if key not in allowed:
            raise ConfigError(
                prefix + key, NOT_SHOWN, f"one of the known keys: {', '.join(sorted(allowed))}"
            )


def _section(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(key, NOT_SHOWN, "an object")
    return value


def _auth(
    value: Any, resources: Collection[str], consumers: Collection[str], base: Path
) -> Auth:
    obj = _section(value, "auth")
    _only_masked(obj, "auth.", {"mode", "tokens", "certificates", "jwt"})
    mode = obj.get("mode", "token")
    if mode not in ("token", "none"):
        raise ConfigError("auth.mode", mode, '"token" (the default) or "none"')
    for key in ("tokens", "certificates"):
        if not isinstance(obj.get(key, []), list):
            raise ConfigError(f"auth.{key}", NOT_SHOWN, "a list")
    tokens = tuple(
        _token(f"auth.tokens[{i}]", entry, resources, consumers, base)
        for i, entry in enumerate(obj.get("tokens", []))
    )
    certificates = tuple(
        _certificate(f"auth.certificates[{i}]", entry, resources, consumers)
        for i, entry in enumerate(obj.get("certificates", []))
    )
    jwt = None if obj.get("jwt") is None else parse_jwt(obj["jwt"], resources, consumers, base)
    if mode == "none":
        if tokens or certificates or jwt:
            raise ConfigError(
                "auth.mode", mode, '"token" when tokens, certificates or jwt are configured'
            )
        return Auth("none")
    if not tokens and not certificates and jwt is None:
        raise ConfigError(
            "auth.tokens", [], 'at least one token or certificate, or jwt (or auth.mode "none")'
        )
    seen: dict[str, str] = {}
    for where, name in [(t.key, t.name) for t in tokens] + [
        (f"auth.certificates[{i}]", c.name) for i, c in enumerate(certificates)
    ]:
        if name in seen:
            raise ConfigError(f"{where}.name", name, f"a name not already used at {seen[name]}")
        seen[name] = where
    digests: dict[bytes, str] = {}
    for token in tokens:
        if token.sha256 is not None:
            if token.sha256 in digests:
                where = digests[token.sha256]
                raise ConfigError(
                    f"{token.key}.sha256", NOT_SHOWN, f"a digest not already at {where}"
                )
            digests[token.sha256] = token.key
    return Auth("token", tokens, certificates, jwt)


def _token(
    key: str, value: Any, resources: Collection[str], consumers: Collection[str], base: Path
) -> TokenEntry:
    obj = _section(value, key)
    sources = {"sha256", "tokenFile", "tokenEnv"}
    _only_masked(obj, key + ".", {"name", "scopes", "expires", *sources})
    given = sorted(sources & obj.keys())
    if len(given) != 1:
        raise ConfigError(
            key, NOT_SHOWN,
            "exactly one of sha256 (the token's SHA-256 in hex), tokenFile, tokenEnv",
        )
    name = cj.name(f"{key}.name", obj.get("name"))
    scopes = parse_scopes(f"{key}.scopes", obj.get("scopes"), resources, consumers)
    expires = _expires(f"{key}.expires", obj.get("expires"))
    source = given[0]
    raw = obj[source]
    if source == "sha256":
        if not isinstance(raw, str) or not _HEX64.match(raw):
            raise ConfigError(
                f"{key}.sha256", NOT_SHOWN,
                "64 hexadecimal digits: the SHA-256 of the token (never the token itself)",
            )
        return TokenEntry(name, scopes, key, sha256=bytes.fromhex(raw), expires=expires)
    if source == "tokenFile":
        path = Path(cj.string(f"{key}.tokenFile", raw))
        path = path if path.is_absolute() else base / path
        return TokenEntry(name, scopes, key, token_file=path, expires=expires)
    if not isinstance(raw, str) or not _ENV_NAME.match(raw):
        raise ConfigError(f"{key}.tokenEnv", raw, "the name of an environment variable")
    return TokenEntry(name, scopes, key, token_env=raw, expires=expires)


def _certificate(
    key: str, value: Any, resources: Collection[str], consumers: Collection[str]
) -> CertificateEntry:
    obj = _section(value, key)
    _only_masked(obj, key + ".", {"name", "subject", "scopes", "expires"})
    name = cj.name(f"{key}.name", obj.get("name"))
    scopes = parse_scopes(f"{key}.scopes", obj.get("scopes"), resources, consumers)
    return CertificateEntry(
        name, _subject(f"{key}.subject", obj.get("subject")), scopes,
        _expires(f"{key}.expires", obj.get("expires")),
    )


def _subject(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    expected = (
        "a certificate subject such as 'CN=tcns,O=Example' (attributes: "
        + ", ".join(SUBJECT_KEYS) + ")"
    )
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, value, expected)
    pairs = []
    for part in value.split(","):
        attribute, equals, text = part.strip().partition("=")
        if not equals or attribute not in SUBJECT_KEYS or not text.strip():
            raise ConfigError(key, value, expected)
        pairs.append((SUBJECT_KEYS[attribute], text.strip()))
    return tuple(pairs)


def _expires(key: str, value: Any) -> datetime | None:
    if value is None:
        return None
    expected = "an ISO 8601 date and time with a time zone, e.g. '2027-01-31T00:00:00Z'"
    if not isinstance(value, str):
        raise ConfigError(key, value, expected)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(key, value, expected) from None
    if when.tzinfo is None:
        raise ConfigError(key, value, expected)
    return when


# --- tls, origins, limits ---------------------------------------------------------------------


def _tls(value: Any, base: Path) -> Tls:
    obj = cj.section(value, "tls")
    cj.only(obj, "tls.", {"certFile", "keyFile", "clientCaFile", "requireClientCert"})

    def path(key: str) -> Path | None:
        if obj.get(key) is None:
            return None
        found = Path(cj.string(f"tls.{key}", obj[key]))
        return found if found.is_absolute() else base / found

    cert, private = path("certFile"), path("keyFile")
    if cert is None or private is None:
        raise ConfigError(
            "tls.certFile" if cert is None else "tls.keyFile", None, "a PEM file name"
        )
    require = obj.get("requireClientCert", False)
    if not isinstance(require, bool):
        raise ConfigError("tls.requireClientCert", require, "true or false")
    ca = path("clientCaFile")
    if require and ca is None:
        raise ConfigError("tls.requireClientCert", require, "false without tls.clientCaFile")
    return Tls(cert, private, ca, require)


def normal_origin(origin: str) -> str | None:
    """`scheme://host[:port]` in lower case as browsers send it, or None if not an origin."""
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + ("" if port in (None, default) else f":{port}")


def _origins(key: str, value: Any) -> frozenset[str]:
    expected = "a list of origins such as 'https://ops.example.com' (scheme://host[:port])"
    if not isinstance(value, list):
        raise ConfigError(key, value, expected)
    out = set()
    for i, entry in enumerate(value):
        origin = normal_origin(entry) if isinstance(entry, str) else None
        if origin is None:
            raise ConfigError(f"{key}[{i}]", entry, expected)
        out.add(origin)
    return frozenset(out)


_LIMIT_KEYS = {
    "requestsPerSecond": ("requests_per_second", cj.optional_positive),
    "requestBurst": ("request_burst", cj.positive_int),
    "registrationsPerSecond": ("registrations_per_second", cj.optional_positive),
    "registrationBurst": ("registration_burst", cj.positive_int),
    "maxListeners": ("max_listeners", cj.positive_int),
}


def _client_limits(value: Any) -> ClientLimits:
    obj = cj.section(value, "clientLimits")
    cj.only(obj, "clientLimits.", set(_LIMIT_KEYS))
    values: dict[str, Any] = {
        attr: check(f"clientLimits.{key}", obj[key])
        for key, (attr, check) in _LIMIT_KEYS.items()
        if obj.get(key) is not None
    }
    return ClientLimits(**values)


__all__ = [
    "SECURITY_KEYS",
    "Auth",
    "CertificateEntry",
    "ClientLimits",
    "Security",
    "Tls",
    "TokenEntry",
    "check_exposure",
    "is_loopback",
    "normal_origin",
    "parse_security",
]
