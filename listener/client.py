"""`Listener`: the asyncio face of the listener, as an async iterator or with callbacks.

    async with Listener(url, instance=..., service="tcns", resources={"vm": ["nic"]}) as feed:
        async for event in feed:
            ...

The decisions (what to send, resume or bootstrap, overflow, retry or give up, which URL next)
are `listener.state.ListenerCore`'s; this module only connects, fetches, sleeps and logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Unpack
from urllib.parse import quote

import orjson

from changefeed.cursor import Position, reached
from changefeed.errors import ChangefeedError, FetchFailed
from changefeed.logs import Log, get_logger
from changefeed.watch import Watch
from listener.buffer import Buffer, make_buffer
from listener.config import ListenerConfig
from listener.connection import DENIED, Connection, access_denied, fetch_page, translate_errors
from listener.events import BootstrapDone, BootstrapRecords, BootstrapStart, ChangeEvent, Event
from listener.options import Client, ClientArgs, ClientOptions, options_of
from listener.pager import Pager, PublisherPager
from listener.state import ListenerCore, Phase

log = get_logger(__name__)

Handler = Callable[[Any], Awaitable[None] | None]


def _with_defaults(options: ClientOptions, config: ListenerConfig) -> ClientOptions:
    """`options` with each backoff and timeout it leaves to the client taken from `config`
    (its pings 0 when `config` disables them): what the listener uses."""
    return dataclasses.replace(
        options,
        backoff=options.backoff or config.backoff,
        http_timeout=options.http_timeout or config.http_timeout,
        open_timeout=options.open_timeout or config.open_timeout,
        ping_interval=(options.ping_interval if options.ping_interval is not None
                       else config.ping_interval or 0.0),
        ping_timeout=(options.ping_timeout if options.ping_timeout is not None
                      else config.ping_timeout or 0.0),
    )


class Listener(Client):
    """A change-feed listener for the publisher(s) at `url`.

    `resources` maps each resource to the sub-resources to hear about (``"*"``: all of them).
    `watches` narrows some of those resources to exact ids and `/`-separated id prefixes
    (``{"vm": Watch.of(prefixes=["servers"])}``): only those objects are bootstrapped and only
    their changes delivered.
    `since` is a cursor the application stored: the listener resumes after it when the publisher
    still can, else it delivers a `Resync` and bootstraps. With `bootstrap=False` it never
    bootstraps: only changes (and Resync when some may have been missed) are delivered.
    The credentials (`token`, `token_file`, `ssl`, `cafile`), `backoff`, the timeouts
    (`http_timeout`, `open_timeout`, `ping_interval`, `ping_timeout`; each defaults to
    `config`'s) and `session` are every client's keyword arguments
    (`listener.options.client_options`), or one `options=` value. A 401 or 403 raises
    AccessDenied.
    `coalesce=True` asks the publisher, when this listener falls too far behind, to send one
    coalesced item per changed id instead of closing it with 4008 (ChangeEvent.coalesced). See
    docs/listener.md.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        instance: str,
        service: str,
        resources: Mapping[str, Sequence[str]],
        watches: Mapping[str, Watch] | None = None,
        since: str | None = None,
        config: ListenerConfig | None = None,
        pager: Pager | None = None,
        buffer: Buffer | None = None,
        bootstrap: bool = True,
        coalesce: bool = False,
        options: ClientOptions | None = None,
        **client: Unpack[ClientArgs],
    ) -> None:
        self.config = config or ListenerConfig()
        chosen = options_of(options, client)
        self._settings = _with_defaults(chosen, self.config)
        """`options` with what it leaves to the client taken from `config`."""
        super().__init__(chosen, self._settings.http_timeout, self._settings.open_timeout)
        self._core = ListenerCore(
            url,
            instance=instance,
            service=service,
            resources=resources,
            watches=watches,
            since=since,
            backoff=self._settings.backoff or self.config.backoff,
            healthy_after=self.config.healthy_after,
            buffer_size=self.config.buffer.size,
            bootstrap=bootstrap,
            coalesce=coalesce,
        )
        self._pager = pager or PublisherPager(self.config.page_size)
        self._buffer = buffer if buffer is not None else make_buffer(self.config.buffer, instance)
        self._events: AsyncGenerator[Event, None] | None = None
        self._reader: asyncio.Task[Any] | None = None
        """The task inside `__anext__`, if any: `aclose` from another task interrupts it."""
        self._closing = False
        self._read_done = asyncio.Event()
        self._on_error: Handler | None = None
        self._delivered: str | None = None
        """The cursor of the last ChangeEvent (or complete bootstrap) handed to the application."""
        self._advanced = asyncio.Event()
        """Set and replaced at each such delivery: what wait_for() waits on."""
        self._log = log.bind(instance=instance, service=service,
                             resources=[kind.resource for kind in self._core.kinds])

    @property
    def cursor(self) -> str | None:
        """The cursor of the last change delivered (or of the last complete bootstrap)."""
        return self._core.cursor

    @property
    def phase(self) -> Phase:
        return self._core.phase

    @property
    def url(self) -> str:
        """The publisher the listener is (or will next be) connected to."""
        return self._core.url

    def __aiter__(self) -> Listener:
        return self

    async def __anext__(self) -> Event:
        """The next event. An `aclose()` from another task ends the iteration (the `async for`
        just stops); a cancellation from elsewhere is raised as usual."""
        if self._closing:
            raise StopAsyncIteration
        if self._events is None:
            self._events = self._run()
        if self._reader is not None:
            raise RuntimeError("the listener is already being iterated by another task")
        task = asyncio.current_task()
        assert task is not None
        self._reader = task
        self._read_done.clear()
        try:
            event = await self._events.__anext__()
            cursor = (self._core.cursor if isinstance(event, ChangeEvent)
                      else event.cursor if isinstance(event, BootstrapDone) else None)
            if cursor is not None:
                self._delivered = cursor
                self._advanced.set()
                self._advanced = asyncio.Event()
            return event
        except asyncio.CancelledError:
            # Ours (from aclose) when aclose asked and no other cancellation is pending.
            if self._closing and task.uncancel() == 0:
                raise StopAsyncIteration from None
            raise
        finally:
            self._reader = None
            self._read_done.set()

    async def wait_for(self, cursor: str, timeout: float) -> None:
        """Return once this listener has handed the application the change at `cursor` (what a
        commit returned), or a later change, or a bootstrap that began after it: read-your-writes.

        ```python
        cursor = await bucket.commit("vm", "vm-1", ["nic"], state)
        await listener.wait_for(cursor, timeout=5)   # another task iterates the listener
        ```

        Raises TimeoutError after `timeout` seconds, CursorGone (changefeed.errors) when the
        listener is in another bucket epoch than `cursor` (the bucket was recreated between),
        CursorError when `cursor` is not a cursor. A bucket in a Redis Cluster gives composite
        cursors (a position per partition): the listener has reached one when it has reached
        each of its positions.
        """
        wanted = Position.decode(cursor)
        async with asyncio.timeout(timeout):
            while not reached(self._delivered, wanted):
                await self._advanced.wait()

    async def aclose(self) -> None:
        """Close the connection and release the buffer and the HTTP session.

        From another task while an `async for` waits for the next event, the iteration ends
        (the generator cannot be closed while it runs, so its task is interrupted first)."""
        self._closing = True
        reader = self._reader
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            await self._read_done.wait()
        if self._events is not None:
            await self._events.aclose()
        await self._buffer.aclose()
        await super().aclose()

    async def run(
        self,
        *,
        on_bootstrap: Handler | None = None,
        on_change: Handler | None = None,
        on_error: Handler | None = None,
    ) -> None:
        """The callback style: runs until cancelled or a fatal error (which it raises).

        `on_bootstrap` gets Resync, BootstrapStart, BootstrapRecords and BootstrapDone events,
        `on_change` each ChangeEvent, `on_error` each failure the listener retries after. Handlers
        may be plain functions or coroutine functions; the next event waits for the handler.
        """
        self._on_error = on_error
        async for event in self:
            handler = on_change if isinstance(event, ChangeEvent) else on_bootstrap
            if handler is not None:
                await _call(handler, event)

    async def fetch(self, resource: str, id: str) -> Any:
        """GET `<bootstrap route>/<id>` from the current publisher: the object, or None if absent.

        Raises FetchFailed on any other answer, or before a registration reply named the route.
        """
        if resource not in self._core.routes:
            raise FetchFailed(resource, "no registration reply has named its bootstrap route yet")
        url = self._core.route_url(resource) + "/" + quote(id, safe="")
        headers = self._headers(url, self._core.url)
        http = self._http()
        async with translate_errors(url, "fetch"), http.get(url, headers=headers) as response:
            body = await response.read()
        if response.status in DENIED:
            raise access_denied(url, response.status, body)
        if response.status == 404:
            return None
        if response.status != 200:
            raise FetchFailed(url, f"HTTP {response.status}: {body[:200]!r}", response.status)
        return orjson.loads(body)

    async def _run(self) -> AsyncGenerator[Event, None]:
        core = self._core
        await self._buffer.clear()
        while True:
            attempt = core.attempt()
            attempt_log = self._log.bind(url=attempt.url, attempt=attempt.number)
            attempt_log.info("connecting", since=attempt.registration.since)
            try:
                async with Connection.open(
                    attempt, core, self._buffer, self.config, self._settings
                ) as connection:
                    plan = core.reply(connection.reply, time.monotonic())
                    attempt_log.info("registered", resumed=plan.resumed, cursor=plan.cursor,
                                     bootstrap=[route.resource for route in plan.routes])
                    if core.coalesce and not plan.coalesce:
                        attempt_log.warning("the publisher does not coalesce: if this listener "
                                            "falls behind it is closed with 4008 and resumes")
                    if plan.resync is not None:
                        attempt_log.warning("resync", reason=plan.resync.reason)
                        yield plan.resync
                    for route in plan.routes:
                        bootstrap = self._bootstrap(connection, route.resource, attempt_log)
                        async with contextlib.aclosing(bootstrap) as events:
                            async for event in events:
                                yield event
                    while True:
                        item = await connection.next_item()
                        yield core.delivered(item)
            except ChangefeedError as error:
                try:
                    delay = core.failed(error, time.monotonic())
                except BaseException as fatal:
                    attempt_log.error("giving up", error=str(fatal),
                                      error_type=type(fatal).__name__)
                    raise
                await self._buffer.clear()
                attempt_log.warning("connection failed; backing off", error=str(error),
                                    error_type=type(error).__name__, delay=round(delay, 3),
                                    failures=core.failures, next_url=core.url)
                if self._on_error is not None:
                    await _call(self._on_error, error)
                await asyncio.sleep(delay)

    async def _bootstrap(
        self, connection: Connection, resource: str, attempt_log: Log
    ) -> AsyncGenerator[Event, None]:
        core = self._core
        yield BootstrapStart(resource)
        url: str | None = self._pager.first(core.bootstrap_url(resource))
        pages = objects = 0
        while url is not None:
            headers = self._headers(url, core.url)
            page = await fetch_page(self._http(), self._pager, url, headers)
            connection.check()
            pages += 1
            objects += len(page.objects)
            attempt_log.debug("bootstrap page", resource=resource, page=pages,
                              objects=len(page.objects))
            yield BootstrapRecords(resource, page.objects)
            connection.check()
            url = page.next_url
        done = core.bootstrap_done(resource, time.monotonic())
        attempt_log.info("bootstrap done", resource=resource, pages=pages, objects=objects,
                         cursor=done.cursor, buffered=await self._buffer.length(),
                         buffer_size=core.buffer_size)
        yield done


async def _call(handler: Handler, argument: Any) -> None:
    result = handler(argument)
    if inspect.isawaitable(result):
        await result
