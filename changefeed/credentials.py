"""A client's credentials: a bearer token and a TLS context. Pure code.

Every client of a publisher (the `Listener`, the `PullConsumer`, `changefeed snoop`,
`changefeed stats`) takes its token the same way: the argument, else the text of a token file,
else the environment variable `CHANGEFEED_TOKEN` (`pick_token`). The token is sent as
`Authorization: Bearer <token>` only to the publisher's own origin (scheme, host and port):
never to another host that a bootstrap page links to. It never appears in a repr, an error or a
log line.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

TOKEN_ENV = "CHANGEFEED_TOKEN"
"""The environment variable a client reads its token from when given none."""
_VISIBLE = frozenset(map(chr, range(0x21, 0x7F)))


def pick_token(
    token: str | None, file_text: str | None, environ: Mapping[str, str]
) -> str | None:
    """The token to send: `token`, else `file_text` (a token file's content), else
    `environ[CHANGEFEED_TOKEN]`; None when none is set. ValueError (not showing it) when it is
    not a single word of visible ASCII."""
    for where, value in (("token", token), ("token file", file_text),
                         (TOKEN_ENV, environ.get(TOKEN_ENV))):
        if value is None:
            continue
        value = value.strip()
        if not value or not set(value) <= _VISIBLE:
            raise ValueError(f"the {where} must be one word of visible ASCII characters")
        return value
    return None


def same_origin(url: str, base: str) -> bool:
    """True when `url` has the scheme, host and port of `base`."""
    a, b = urlsplit(url), urlsplit(base)
    ports = {"http": 80, "https": 443, "ws": 80, "wss": 443}
    secure = {"https": "https", "wss": "https", "http": "http", "ws": "http"}
    return (
        secure.get(a.scheme) == secure.get(b.scheme)
        and (a.hostname or "").lower() == (b.hostname or "").lower()
        and (a.port or ports.get(a.scheme)) == (b.port or ports.get(b.scheme))
    )


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client presents: a bearer token (None: none) and the TLS context for https and
    wss (None: the system's trusted CAs). A client certificate (mTLS) goes into `ssl` with
    `load_cert_chain`."""

    token: str | None = field(default=None, repr=False)
    ssl: ssl.SSLContext | None = None

    def headers_for(self, url: str, base: str) -> dict[str, str]:
        """The headers for a request to `url` of the publisher at `base`."""
        if self.token is None or not same_origin(url, base):
            return {}
        return {"Authorization": f"Bearer {self.token}"}

    def __repr__(self) -> str:
        return f"Credentials(token={'<set>' if self.token else None}, ssl={self.ssl!r})"


NONE = Credentials()

__all__ = ["NONE", "TOKEN_ENV", "Credentials", "pick_token", "same_origin"]
