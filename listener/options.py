"""What every client of a publisher shares, written once: its options and its HTTP plumbing.

    Listener(url, ..., token_file="/etc/tcns/token", cafile="ca.pem", backoff=Backoff(1, 60))
    PullConsumer(url, ..., **same)        # the same keyword arguments (`ClientArgs`)
    options = client_options(token_file="/etc/tcns/token", session=shared)
    DurableConsumer(url, "billing", options=options)   # or one value for several clients

`Listener`, `PullConsumer`, `DurableConsumer` and `changefeed snoop` take the same keyword
arguments for the credentials (`token`, `token_file`, `ssl`, `cafile`), the retries
(`backoff`), the timeouts (`http_timeout` for a plain request, `open_timeout` to connect, and
for a websocket `ping_interval` and `ping_timeout`) and the aiohttp session (`session`), or one
`ClientOptions` built from them (`options=`). Each is a `Client`: `async
with` closes it, and it closes the session it made itself, never one it was given.
"""

from __future__ import annotations

import ssl as ssl_module
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self, TypedDict

import aiohttp

from changefeed.backoff import Backoff
from changefeed.credentials import NONE, Credentials
from changefeed.errors import ChangefeedError, InvalidOption
from changefeed.logs import Log
from listener.credentials import load_credentials
from listener.state import publisher_urls

ErrorHandler = Callable[[ChangefeedError], None]
"""A pull consumer's `on_error`: told each failure the consumer retries after; must not block."""


class ClientArgs(TypedDict, total=False):
    """The keyword arguments every client takes (see `client_options`)."""

    token: str | None
    token_file: str | Path | None
    ssl: ssl_module.SSLContext | None
    cafile: str | Path | None
    backoff: Backoff | None
    http_timeout: float | None
    open_timeout: float | None
    ping_interval: float | None
    ping_timeout: float | None
    session: aiohttp.ClientSession | None


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How a client talks to its publisher: its credentials, its backoff, its timeouts and the
    aiohttp session to send with (None: one of its own). A backoff or timeout of None is the
    client's default (a listener's: its `ListenerConfig`'s)."""

    credentials: Credentials = NONE
    backoff: Backoff | None = None
    http_timeout: float | None = None
    """Seconds a request other than a long poll may take."""
    session: aiohttp.ClientSession | None = None
    open_timeout: float | None = None
    """Seconds to connect (a listener's websocket: and to get the registration reply)."""
    ping_interval: float | None = None
    """Seconds between a websocket's pings; 0: no pings (no dead-peer detection)."""
    ping_timeout: float | None = None
    """Seconds a websocket waits for a pong; 0: for ever."""


def client_options(
    *,
    token: str | None = None,
    token_file: str | Path | None = None,
    ssl: ssl_module.SSLContext | None = None,
    cafile: str | Path | None = None,
    backoff: Backoff | None = None,
    http_timeout: float | None = None,
    session: aiohttp.ClientSession | None = None,
    open_timeout: float | None = None,
    ping_interval: float | None = None,
    ping_timeout: float | None = None,
) -> ClientOptions:
    """The options of a client. `token` (else the content of `token_file`, else the environment
    variable CHANGEFEED_TOKEN) is sent as `Authorization: Bearer` to the publisher's own origin;
    `ssl` (or a context trusting `cafile`) verifies an https/wss publisher. InvalidOption (never
    showing a token) on a conflict, an unreadable file or a bad value."""
    if backoff is not None and not isinstance(backoff, Backoff):
        raise InvalidOption("backoff", backoff, "a changefeed.backoff.Backoff")
    _check_seconds("http_timeout", http_timeout)
    _check_seconds("open_timeout", open_timeout)
    _check_seconds("ping_interval", ping_interval, zero="no pings")
    _check_seconds("ping_timeout", ping_timeout, zero="for ever")
    credentials = load_credentials(token, token_file, ssl, cafile)
    return ClientOptions(credentials, backoff, http_timeout, session, open_timeout,
                         ping_interval, ping_timeout)


def _check_seconds(name: str, value: object, zero: str | None = None) -> None:
    """InvalidOption unless `value` is None or a number of seconds > 0 (>= 0 with `zero`, what
    0 means)."""
    if value is None:
        return
    if not isinstance(value, bool) and isinstance(value, int | float) and (
        value > 0 or (zero is not None and value == 0)
    ):
        return
    expected = ("a number of seconds > 0, or None" if zero is None
                else f"a number of seconds >= 0 (0: {zero}), or None")
    raise InvalidOption(name, value, expected)


def report_retry(
    log: Log, what: str, error: ChangefeedError, delay: float, failures: int,
    on_error: ErrorHandler | None,
) -> None:
    """Report a failure a pull consumer retries after `delay` seconds: a warning (`what`),
    then `on_error`, if any."""
    log.warning(what, error=str(error), error_type=type(error).__name__, delay=round(delay, 3),
                failures=failures)
    if on_error is not None:
        on_error(error)


def options_of(options: ClientOptions | None, args: ClientArgs) -> ClientOptions:
    """A client's options: `options` as given, else built from its keyword arguments."""
    if options is None:
        return client_options(**args)
    if args:
        raise InvalidOption(sorted(args)[0], "<given>", "not to be given with options=")
    return options


def base_url(url: str) -> str:
    """The http(s) base URL of the publisher at `url`; InvalidOption when it is none."""
    try:
        return publisher_urls(url)[0]
    except ValueError:
        raise InvalidOption("url", url, "http://host:port (or https://)") from None


class Client:
    """The plumbing of every client: its options, `async with`, and its HTTP session (made on
    first use, with `session_timeout` seconds for every request (None: aiohttp's default) and
    `open_timeout` (else `options.open_timeout`) to connect (None: aiohttp's default), unless
    one was given)."""

    def __init__(
        self, options: ClientOptions, session_timeout: float | None = None,
        open_timeout: float | None = None,
    ) -> None:
        self.options = options
        self._session_timeout = session_timeout
        self._open_timeout = open_timeout or options.open_timeout
        self._session = options.session

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session, unless it was given."""
        if self._session is not None and self._session is not self.options.session:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.options.credentials.ssl or True)
            default = aiohttp.client.DEFAULT_TIMEOUT
            timeout = aiohttp.ClientTimeout(
                total=default.total if self._session_timeout is None else self._session_timeout,
                connect=default.connect, sock_read=default.sock_read,
                sock_connect=self._open_timeout or default.sock_connect,
                ceil_threshold=default.ceil_threshold,
            )
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self._session

    def _headers(self, url: str, base: str) -> dict[str, str]:
        """The headers for a request to `url` of the publisher at `base` (its token, if any)."""
        return self.options.credentials.headers_for(url, base)


__all__ = [
    "Client", "ClientArgs", "ClientOptions", "ErrorHandler", "base_url", "client_options",
    "options_of", "report_retry",
]
