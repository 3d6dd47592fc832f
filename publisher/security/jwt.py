"""Signed tokens for browsers (JWT, verified with PyJWT): HS256 with a shared secret, or
RS256/EdDSA (and the other `KEY_ALGORITHMS`) with public keys from a JWKS file or URL.

`JwtVerifier.build(config, environ)` reads the secret or the JWKS file (at start and on every
reload: a ConfigError naming the key when it cannot). A JWKS is read again every `refresh`
seconds by a daemon thread (a URL only by it, from the start: never on the event loop), and at
once (at most every 10 s) when a token names a `kid` it does not know. The URL is the one
config.js names, never one a token names (`jku`, `x5u` are ignored), and redirects are refused.

`verify(token, now)` gives the identity `jwt:<sub>` with the scopes of the token's `scope`
(space-separated, as OAuth 2.0) or `scopes` (a list) claim, checked as config.js's scopes are,
and its `exp`; or Denied with a reason for the log that never holds the token.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import jwt
import structlog

from changefeed.errors import ConfigError
from publisher.config.jwt import JwtConfig
from publisher.config.scopes import parse_scopes

log = structlog.get_logger(__name__)

MIN_SECRET_BYTES = 32
"""A shared secret shorter than this is refused (RFC 7518 3.2: at least the hash's size)."""
FETCH_TIMEOUT = 5.0
MAX_JWKS_BYTES = 1 << 20
UNKNOWN_KID_REFRESH = 10.0
"""Seconds between two reads of the JWKS caused by tokens naming an unknown `kid`."""
PREFIX = "jwt:"
"""Identities of tokens are named `jwt:<sub>`."""


def looks_like_jwt(token: str) -> bool:
    """Three base64url segments, the first a JSON object (`eyJ`): a JWT, not a config.js token."""
    return token.startswith("eyJ") and token.count(".") == 2


class JwtVerifier:
    def __init__(self, config: JwtConfig, secret: bytes | None,
                 keys: jwt.PyJWKSet | None) -> None:
        self.config = config
        self._secret = secret
        self._keys = keys
        self._lock = threading.Lock()
        self._refreshed = time.monotonic()
        self._wake = threading.Event()
        self.closed = False
        """Set by `close`: the refresher thread ends at once."""
        self.refresher: threading.Thread | None = None

    @classmethod
    def build(cls, config: JwtConfig, environ: Mapping[str, str] | None = None) -> JwtVerifier:
        if config.shared_secret:
            return cls(config, _secret(config, os.environ if environ is None else environ), None)
        if config.jwks_file is not None:
            verifier = cls(config, None, _read_jwks(config))
            _start_refresher(verifier, first=False)
        else:
            # Never fetched on the event loop: the refresher thread reads the URL at once, and
            # tokens are refused (401) until it has (logged if it cannot).
            verifier = cls(config, None, _LAST_READ.get(str(config.jwks_url)))
            _start_refresher(verifier, first=True)
        return verifier

    def verify(self, token: str, now: datetime) -> tuple[str, frozenset[str], datetime] | str:
        """(name, scopes, expiry) of a valid token; else why it is refused (for the log)."""
        config = self.config
        try:
            key = self._key(token)
            claims = jwt.decode(
                token, key, algorithms=list(config.algorithms), audience=config.audience,
                issuer=config.issuer, leeway=config.leeway,
                options={"require": ["exp", "sub", "aud"] + (["iss"] if config.issuer else []),
                         "verify_iat": True},
            )
        except jwt.PyJWTError as exc:
            return f"jwt refused: {type(exc).__name__}: {exc}"[:300]
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject or len(subject) > 200:
            return "jwt refused: sub must be a non-empty string of at most 200 characters"
        raw = claims.get("scope", claims.get("scopes"))
        listed = raw.split() if isinstance(raw, str) else raw
        try:
            scopes = parse_scopes("scope", listed, config.resources, config.consumers)
        except ConfigError as exc:
            return f"jwt of {subject!r} refused: {exc}"[:300]
        expires = datetime.fromtimestamp(float(claims["exp"]), UTC)
        return PREFIX + subject, scopes, expires

    def _key(self, token: str) -> Any:
        if self._secret is not None:
            return self._secret
        header = jwt.get_unverified_header(token)
        kid = header.get("kid")
        with self._lock:
            keys = self._keys
        found = _pick(keys, kid, header.get("alg"))
        if keys is None:
            raise jwt.InvalidKeyError("the JWKS has not been read yet")
        if found is None and kid is not None:
            if time.monotonic() - self._refreshed >= UNKNOWN_KID_REFRESH:
                self._wake.set()  # the refresher reads the JWKS again, for the next token
            raise jwt.InvalidKeyError(f"no key {kid!r} in the JWKS")
        if found is None:
            raise jwt.InvalidKeyError("no key of the JWKS fits the token's alg (give a kid)")
        return found.key

    def close(self) -> None:
        """Stop refreshing (the service stopped, or a reload replaced this verifier): the
        refresher thread ends now, not when the verifier is garbage-collected."""
        self.closed = True
        self._wake.set()

    def refresh(self) -> None:
        """Read the JWKS again; on failure keep the keys it had (and log why)."""
        self._refreshed = time.monotonic()
        try:
            keys = _read_jwks(self.config)
        except ConfigError as exc:
            log.warning("jwks not refreshed, keeping the keys read before", error=str(exc))
            return
        with self._lock:
            self._keys = keys
        if self.config.jwks_url is not None:
            _LAST_READ[self.config.jwks_url] = keys


_LAST_READ: dict[str, jwt.PyJWKSet] = {}
"""The keys last read from each JWKS URL: a reload's new verifier starts with them (and reads the
URL again at once) rather than refusing every token until its first answer."""


def _pick(keys: jwt.PyJWKSet | None, kid: Any, alg: Any) -> jwt.PyJWK | None:
    if keys is None:
        return None
    if kid is not None:
        return next((k for k in keys.keys if k.key_id == kid), None)
    fitting = [k for k in keys.keys if k.algorithm_name == alg]
    return fitting[0] if len(fitting) == 1 else None


def _start_refresher(verifier: JwtVerifier, first: bool) -> None:
    """A daemon thread that reads the JWKS every `refresh` seconds (and at once when `first`)
    until `verifier` is closed or gone (a reload builds a new verifier and closes the old one)."""
    ref = weakref.ref(verifier)
    wake, interval = verifier._wake, verifier.config.refresh
    if first:
        wake.set()

    def run() -> None:
        while True:
            wake.wait(interval)
            wake.clear()
            current = ref()
            if current is None or current.closed:
                return
            current.refresh()
            del current

    verifier.refresher = threading.Thread(target=run, name="jwks-refresh", daemon=True)
    verifier.refresher.start()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The JWKS comes from the URL config.js names: a redirect elsewhere is an error."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _secret(config: JwtConfig, environ: Mapping[str, str]) -> bytes:
    if config.secret_file is not None:
        key = "auth.jwt.secretFile"
        try:
            secret = config.secret_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(key, str(config.secret_file),
                              f"a readable file holding the secret ({exc.strerror})") from None
    else:
        key = "auth.jwt.secretEnv"
        assert config.secret_env is not None
        secret = environ.get(config.secret_env, "").strip().encode()
        if not secret:
            raise ConfigError(key, config.secret_env, "an environment variable that is set")
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(key, "<not shown>",
                          f"a secret of at least {MIN_SECRET_BYTES} bytes (openssl rand -hex 32)")
    return secret


def _read_jwks(config: JwtConfig) -> jwt.PyJWKSet:
    if config.jwks_file is not None:
        key, where = "auth.jwt.jwksFile", str(config.jwks_file)
        try:
            text = config.jwks_file.read_bytes()[:MAX_JWKS_BYTES]
        except OSError as exc:
            raise ConfigError(key, where, f"a readable JWKS file ({exc.strerror})") from None
    else:
        key, where = "auth.jwt.jwksUrl", str(config.jwks_url)
        try:
            request = urllib.request.Request(where, headers={"Accept": "application/json"})
            with _OPENER.open(request, timeout=FETCH_TIMEOUT) as response:
                text = response.read(MAX_JWKS_BYTES)
        except (OSError, ValueError) as exc:
            raise ConfigError(key, where, f"a reachable JWKS URL ({exc})") from None
    try:
        keys = jwt.PyJWKSet.from_dict(json.loads(text))
    except (ValueError, jwt.PyJWTError) as exc:
        raise ConfigError(key, where, f'a JWKS: {{"keys": [...]}} ({exc})') from None
    return keys


__all__ = ["PREFIX", "JwtVerifier", "looks_like_jwt"]
