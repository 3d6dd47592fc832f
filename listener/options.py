"""What every client of a publisher shares, written once: its options and its HTTP plumbing.

    Listener(url, ..., token_file="/etc/tcns/token", cafile="ca.pem", backoff=Backoff(1, 60))
    PullConsumer(url, ..., **same)        # the same keyword arguments (`ClientArgs`)
    options = client_options(token_file="/etc/tcns/token", session=shared)
    DurableConsumer(url, "billing", options=options)   # or one value for several clients

`Listener`, `PullConsumer`, `DurableConsumer` and `changefeed snoop` take the same keyword
arguments for the credentials (`token`, `token_file`, `ssl`, `cafile`), the retries
(`backoff`), the time a plain request may take (`http_timeout`) and the aiohttp session
(`session`), or one `ClientOptions` built from them (`options=`). Each is a `Client`: `async
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
    session: aiohttp.ClientSession | None


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """How a client talks to its publisher: its credentials, its backoff (None: the client's
    default), the seconds a request other than a long poll may take (None: the client's
    default) and the aiohttp session to send with (None: one of its own)."""

    credentials: Credentials = NONE
    backoff: Backoff | None = None
    http_timeout: float | None = None
    session: aiohttp.ClientSession | None = None


def client_options(
    *,
    token: str | None = None,
    token_file: str | Path | None = None,
    ssl: ssl_module.SSLContext | None = None,
    cafile: str | Path | None = None,
    backoff: Backoff | None = None,
    http_timeout: float | None = None,
    session: aiohttp.ClientSession | None = None,
) -> ClientOptions:
    """The options of a client. `token` (else the content of `token_file`, else the environment
    variable CHANGEFEED_TOKEN) is sent as `Authorization: Bearer` to the publisher's own origin;
    `ssl` (or a context trusting `cafile`) verifies an https/wss publisher. InvalidOption (never
    showing a token) on a conflict, an unreadable file or a bad value."""
    if backoff is not None and not isinstance(backoff, Backoff):
        raise InvalidOption("backoff", backoff, "a changefeed.backoff.Backoff")
    if http_timeout is not None and (
        isinstance(http_timeout, bool) or not isinstance(http_timeout, int | float)
        or not http_timeout > 0
    ):
        raise InvalidOption("http_timeout", http_timeout, "a number of seconds > 0, or None")
    credentials = load_credentials(token, token_file, ssl, cafile)
    return ClientOptions(credentials, backoff, http_timeout, session)


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
    first use, with `session_timeout` seconds for every request (None: aiohttp's default), unless
    one was given)."""

    def __init__(self, options: ClientOptions, session_timeout: float | None = None) -> None:
        self.options = options
        self._session_timeout = session_timeout
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
            if self._session_timeout is None:  # aiohttp's default
                self._session = aiohttp.ClientSession(connector=connector)
            else:
                timeout = aiohttp.ClientTimeout(total=self._session_timeout)
                self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self._session

    def _headers(self, url: str, base: str) -> dict[str, str]:
        """The headers for a request to `url` of the publisher at `base` (its token, if any)."""
        return self.options.credentials.headers_for(url, base)


__all__ = [
    "Client", "ClientArgs", "ClientOptions", "ErrorHandler", "base_url", "client_options",
    "options_of", "report_retry",
]
