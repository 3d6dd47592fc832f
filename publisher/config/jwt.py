"""`auth.jwt` of config.js: signed, short-lived tokens for browsers (docs/security.md#browsers).

`parse_jwt` builds a frozen `JwtConfig`. Pure code: the secret and the JWKS are only named here;
`publisher.security.jwt.JwtVerifier` reads them (at start, on every reload, and the JWKS again
every `refresh` seconds). A wrong value names its key and what was expected; a secret is never
shown (`<not shown>`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from changefeed.errors import ConfigError

NOT_SHOWN = "<not shown>"
SECRET_ALGORITHMS = ("HS256", "HS384", "HS512")
"""What a shared secret (`secretFile`, `secretEnv`) verifies."""
KEY_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")
"""What public keys (`jwksFile`, `jwksUrl`) verify."""
SOURCES = ("secretFile", "secretEnv", "jwksFile", "jwksUrl")
_KEYS = frozenset({*SOURCES, "audience", "issuer", "algorithms", "refresh", "leeway"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True, slots=True)
class JwtConfig:
    """How JWTs are verified. Exactly one of the four sources is set."""

    audience: str
    """The `aud` every token must carry (e.g. the publisher's URL or "changefeed")."""
    algorithms: tuple[str, ...]
    issuer: str | None = None
    """The `iss` every token must carry; None: not checked."""
    secret_file: Path | None = None
    secret_env: str | None = None
    jwks_file: Path | None = None
    jwks_url: str | None = None
    refresh: float = 300.0
    """Seconds between two reads of the JWKS (file or URL)."""
    leeway: float = 0.0
    """Seconds of clock skew allowed on `exp`, `nbf` and `iat`."""
    resources: frozenset[str] = frozenset()
    consumers: frozenset[str] = frozenset()
    """What `listen:`, `read:`, `feed:` and `durable:` scopes of a token may name."""

    @property
    def shared_secret(self) -> bool:
        return self.secret_file is not None or self.secret_env is not None


def parse_jwt(
    value: Any, resources: Collection[str], consumers: Collection[str], base: Path
) -> JwtConfig:
    key = "auth.jwt"
    if not isinstance(value, dict):
        raise ConfigError(key, NOT_SHOWN, "an object")
    for name in value:
        if name not in _KEYS:
            raise ConfigError(f"{key}.{name}", NOT_SHOWN,
                              f"one of the known keys: {', '.join(sorted(_KEYS))}")
    given = [name for name in SOURCES if name in value]
    if len(given) != 1:
        raise ConfigError(key, NOT_SHOWN, "exactly one of " + ", ".join(SOURCES))
    source = given[0]
    audience = value.get("audience")
    if not isinstance(audience, str) or not audience:
        raise ConfigError(f"{key}.audience", audience,
                          "the non-empty `aud` every token must carry, e.g. \"changefeed\"")
    issuer = value.get("issuer")
    if issuer is not None and (not isinstance(issuer, str) or not issuer):
        raise ConfigError(f"{key}.issuer", issuer, "a non-empty string (the tokens' `iss`)")
    allowed = SECRET_ALGORITHMS if source.startswith("secret") else KEY_ALGORITHMS
    default = ["HS256"] if source.startswith("secret") else ["RS256", "EdDSA"]
    algorithms = value.get("algorithms", default)
    if (not isinstance(algorithms, list) or not algorithms
            or any(a not in allowed for a in algorithms)):
        raise ConfigError(f"{key}.algorithms", algorithms,
                          f"a non-empty list of {', '.join(allowed)} (for {source})")
    refresh = _seconds(f"{key}.refresh", value.get("refresh", 300), minimum=1)
    leeway = _seconds(f"{key}.leeway", value.get("leeway", 0), minimum=0)
    raw = value[source]
    fields: dict[str, Any] = {}
    if source in ("secretFile", "jwksFile"):
        if not isinstance(raw, str) or not raw:
            raise ConfigError(f"{key}.{source}", raw, "a file name")
        path = Path(raw) if Path(raw).is_absolute() else base / raw
        fields["secret_file" if source == "secretFile" else "jwks_file"] = path
    elif source == "secretEnv":
        if not isinstance(raw, str) or not _ENV_NAME.match(raw):
            raise ConfigError(f"{key}.secretEnv", raw, "the name of an environment variable")
        fields["secret_env"] = raw
    else:
        fields["jwks_url"] = _jwks_url(f"{key}.jwksUrl", raw)
    return JwtConfig(
        audience, tuple(algorithms), issuer, refresh=refresh, leeway=leeway,
        resources=frozenset(resources), consumers=frozenset(consumers), **fields,
    )


def _seconds(key: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(key, value, f"a number of seconds >= {minimum:g}")
    return float(value)


def _jwks_url(key: str, value: Any) -> str:
    expected = "an https:// URL of a JWKS (http:// only to a loopback address)"
    if not isinstance(value, str):
        raise ConfigError(key, value, expected)
    try:
        parts = urlsplit(value)
        host = parts.hostname or ""
    except ValueError:
        raise ConfigError(key, value, expected) from None
    if parts.scheme == "https" and host:
        return value
    if parts.scheme == "http" and host in LOOPBACK_HOSTS:
        return value
    raise ConfigError(key, value, expected)


__all__ = ["KEY_ALGORITHMS", "SECRET_ALGORITHMS", "JwtConfig", "parse_jwt"]
