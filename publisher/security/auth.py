"""Who is asking: bearer tokens and client certificates to identities with scopes.

`Authenticator.build(auth, environ)` reads the token files and environment variables that
config.js names (at start, and again on every reload) and keeps only the SHA-256 of each token.
`authenticate` hashes the presented token and compares it with every digest in constant time
(`hmac.compare_digest`, no early exit). A token is never logged or put into an error; a refusal
carries the first 8 hex digits of its hash at most (`Denied.token_hash`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from changefeed.errors import ConfigError
from publisher.config.scopes import EVERYTHING, allows
from publisher.config.security import NOT_SHOWN, Auth, CertificateEntry, TokenEntry
from publisher.security.jwt import JwtVerifier, looks_like_jwt

log = structlog.get_logger(__name__)

MIN_TOKEN_LENGTH = 16
"""Characters a token read from a file or the environment must have at least."""
MAX_TOKEN_LENGTH = 4096
_TOKEN_CHARS = frozenset(map(chr, range(0x21, 0x7F)))
"""Visible ASCII: what an HTTP header carries without escaping."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request comes from and what it may do."""

    name: str
    scopes: frozenset[str]
    via: str
    """"token", "certificate", "jwt", or "none" (the anonymous identity without
    authentication)."""
    proof: bytes | frozenset[tuple[str, str]] | None = field(
        default=None, compare=False, repr=False
    )
    """What it was recognised by, to check it again later (`Authenticator.recheck`): the
    SHA-256 of its token, or its certificate's subject attributes."""
    expires: datetime | None = field(default=None, compare=False)
    """When its credentials stop being valid: a JWT's `exp` (config.js identities: None, their
    `expires` is looked up again by `recheck`)."""

    def allows(self, scope: str) -> bool:
        return allows(self.scopes, scope)


ANONYMOUS = Identity("anonymous", EVERYTHING, "none")


@dataclass(frozen=True, slots=True)
class Denied:
    """Why a request has no identity. `reason` is for the log; the client is told only whether
    its token was missing or invalid (`token_given`), never which."""

    reason: str
    token_given: bool
    token_hash: str | None = None
    """The first 8 hex digits of the SHA-256 of the token presented, for the log."""


@dataclass(frozen=True, slots=True)
class _Known:
    digest: bytes
    entry: TokenEntry


def token_hash(token: str) -> str:
    """What may be logged of a token: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(token.encode()).hexdigest()[:8]


class Authenticator:
    """The identities of config.js's `auth`; None (no auth) lets everyone in as ANONYMOUS."""

    def __init__(self, auth: Auth | None, known: tuple[_Known, ...] = (),
                 jwt: JwtVerifier | None = None) -> None:
        self.auth = auth
        self._known = known
        self._jwt = jwt
        self._certificates: tuple[CertificateEntry, ...] = auth.certificates if auth else ()

    def close(self) -> None:
        """Stop what reads keys in the background (the JWKS refresher)."""
        if self._jwt is not None:
            self._jwt.close()

    @classmethod
    def build(cls, auth: Auth | None, environ: Mapping[str, str] | None = None) -> Authenticator:
        """Read every token source (ConfigError naming the key if one cannot be read)."""
        if auth is None or auth.mode == "none":
            return cls(auth)
        env = os.environ if environ is None else environ
        known = tuple(_Known(_digest(entry, env), entry) for entry in auth.tokens)
        verifier = None if auth.jwt is None else JwtVerifier.build(auth.jwt, env)
        return cls(auth, known, verifier)

    @property
    def required(self) -> bool:
        return self.auth is not None and self.auth.mode == "token"

    def authenticate(
        self, authorization: str | None, peercert: Mapping[str, Any] | None, now: datetime
    ) -> Identity | Denied:
        """The identity of a request: its bearer token if it sends one, else its verified
        client certificate; Denied when neither names a current identity."""
        if not self.required:
            return ANONYMOUS
        if authorization is not None:
            return self._token(authorization, now)
        if peercert:
            return self._certificate(peercert, now)
        return Denied("no credentials", token_given=False)

    def _token(self, authorization: str, now: datetime) -> Identity | Denied:
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Denied("Authorization is not 'Bearer <token>'", token_given=True)
        if len(token) > MAX_TOKEN_LENGTH:
            return Denied("token too long", token_given=True)
        if self._jwt is not None and looks_like_jwt(token):
            return self._signed(token, now)
        digest = hashlib.sha256(token.encode()).digest()
        found: TokenEntry | None = None
        for known in self._known:  # every digest compared: no early exit
            if hmac.compare_digest(known.digest, digest):
                found = known.entry
        short = digest.hex()[:8]
        if found is None:
            return Denied("unknown token", token_given=True, token_hash=short)
        if found.expires is not None and now >= found.expires:
            return Denied(f"expired token of {found.name!r}", token_given=True, token_hash=short)
        return Identity(found.name, found.scopes, "token", digest)

    def _signed(self, token: str, now: datetime) -> Identity | Denied:
        assert self._jwt is not None
        verified = self._jwt.verify(token, now)
        if isinstance(verified, str):
            return Denied(verified, token_given=True, token_hash=token_hash(token))
        name, scopes, expires = verified
        return Identity(name, scopes, "jwt", expires=expires)

    def _certificate(self, peercert: Mapping[str, Any], now: datetime) -> Identity | Denied:
        attributes = frozenset(
            (str(name), str(value))
            for rdn in peercert.get("subject", ())
            for name, value in rdn
        )
        return self._subject(attributes, now)

    def _subject(self, attributes: frozenset[tuple[str, str]], now: datetime) -> Identity | Denied:
        for entry in self._certificates:
            if all(pair in attributes for pair in entry.subject):
                if entry.expires is not None and now >= entry.expires:
                    return Denied(f"expired certificate identity {entry.name!r}", False)
                return Identity(entry.name, entry.scopes, "certificate", attributes)
        subject = ",".join(f"{name}={value}" for name, value in sorted(attributes))
        return Denied(f"client certificate {subject!r} is no identity of auth.certificates",
                      token_given=False)


    def recheck(self, identity: Identity, now: datetime) -> Identity | Denied:
        """`identity` as these settings see it now, for connections that outlive a reload or an
        expiry. What is authorized is the identity, by name: a reload that gives it a new token
        or certificate (a rotation) keeps it, with the scopes of the entry its own credentials
        still match if they do, else of its newest entry. Denied when no entry of that name is
        left, when every entry of it has expired, or when authentication became required."""
        if not self.required:
            return ANONYMOUS
        if identity.via == "jwt":
            if self._jwt is None:
                return Denied(f"signed tokens (auth.jwt) no longer accepted for {identity.name!r}",
                              token_given=True)
            if identity.expires is not None and now >= identity.expires:
                return Denied(f"expired token of {identity.name!r}", token_given=True)
            return identity
        if isinstance(identity.proof, bytes):
            entries: list[TokenEntry | CertificateEntry] = []
            for known in self._known:
                if known.entry.name != identity.name:
                    continue
                if hmac.compare_digest(known.digest, identity.proof):
                    entries.insert(0, known.entry)  # its own token's entry first
                else:
                    entries.append(known.entry)
            kind = "token"
        elif isinstance(identity.proof, frozenset):
            entries = [c for c in self._certificates if c.name == identity.name]
            kind = "certificate identity"
        else:
            return Denied("authentication is required now", token_given=False)
        if not entries:
            return Denied(f"{kind} {identity.name!r} removed", token_given=kind == "token")
        for entry in entries:
            if entry.expires is None or now < entry.expires:
                return Identity(identity.name, entry.scopes, identity.via, identity.proof)
        return Denied(f"expired {kind} {identity.name!r}", token_given=kind == "token")

    def next_expiry(self, now: datetime) -> datetime | None:
        """The soonest moment after `now` at which a token or certificate identity expires."""
        moments = [e.entry.expires for e in self._known if e.entry.expires is not None]
        moments += [c.expires for c in self._certificates if c.expires is not None]
        later = [m for m in moments if m > now]
        return min(later) if later else None


def now() -> datetime:
    return datetime.now(UTC)


def _digest(entry: TokenEntry, environ: Mapping[str, str]) -> bytes:
    if entry.sha256 is not None:
        return entry.sha256
    if entry.token_file is not None:
        key = f"{entry.key}.tokenFile"
        try:
            token = entry.token_file.read_text().strip()
            mode = entry.token_file.stat().st_mode
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(
                key, str(entry.token_file), f"a readable token file ({why})"
            ) from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("token file readable by other users: chmod 600 it",
                        file=str(entry.token_file), identity=entry.name)
    else:
        assert entry.token_env is not None
        key = f"{entry.key}.tokenEnv"
        token = environ.get(entry.token_env, "").strip()
        if not token:
            raise ConfigError(key, entry.token_env, "an environment variable that is set")
    if len(token) < MIN_TOKEN_LENGTH or len(token) > MAX_TOKEN_LENGTH or not set(token) <= (
        _TOKEN_CHARS
    ):
        raise ConfigError(
            key, NOT_SHOWN,
            f"a token of {MIN_TOKEN_LENGTH} to {MAX_TOKEN_LENGTH} visible ASCII characters "
            "(e.g. `openssl rand -hex 32`)",
        )
    return hashlib.sha256(token.encode()).digest()


__all__ = ["ANONYMOUS", "Authenticator", "Denied", "Identity", "now", "token_hash"]
