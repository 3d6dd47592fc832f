"""`PullConsumer`: fetch, next and consume over the publisher's `events` long poll (ADR-37).

    async with PullConsumer(url, resource="vm", sub_resources=["nic"], after=saved) as consumer:
        async for item in consumer.consume(max_messages=100):
            handle(item)
            save(consumer.cursor)

What to ask for, when to refill, what to keep and when a heartbeat is missed are
`listener.consumer_state`'s decisions, whether to retry `changefeed.retry`'s; the requests and
replies are `changefeed.longpoll`'s. This module only sends the requests, sleeps and logs.
Errors of aiohttp become the consumer's own in `request_events`, and nowhere else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Unpack

import aiohttp

from changefeed.backoff import Backoff
from changefeed.errors import (
    ChangefeedError,
    HeartbeatMissed,
    InvalidOption,
    PullFailed,
)
from changefeed.logs import get_logger
from changefeed.longpoll import EventsQuery, EventsReply
from changefeed.protocol import CHANGEFEEDS, ChangeItem
from changefeed.retry import Retrier
from changefeed.tasks import cancel_and_wait
from listener.consumer_options import (
    DEFAULT_EXPIRES,
    consume_options,
    event_filter,
    fetch_options,
)
from listener.consumer_state import ConsumeCore, ConsumeState, FetchCore
from listener.durable import DurableConsumer
from listener.options import (
    Client,
    ClientArgs,
    ClientOptions,
    ErrorHandler,
    base_url,
    options_of,
    report_retry,
)
from listener.refusal import refusal

log = get_logger(__name__)

EVENTS = CHANGEFEEDS + "/events"



async def request_events(
    session: aiohttp.ClientSession,
    url: str,
    params: list[tuple[str, str]],
    deadline: float,
    heartbeat_window: float,
    headers: dict[str, str] | None = None,
) -> EventsReply:
    """One `GET .../events`, answered by `deadline` (the loop's clock) or a missed heartbeat.

    The one place where aiohttp's errors and the HTTP statuses become the consumer's: 200 is
    read, 401 and 403 are AccessDenied and other 4xx PullRejected (raised), 5xx and no answer
    PullFailed, a garbled body ProtocolError (both retried after a backoff delay), silence until
    `deadline` HeartbeatMissed
    (reported, pulled again at once: a warning, not a failure, in `changefeed.retry`).
    """
    try:
        async with asyncio.timeout_at(deadline):
            try:
                async with session.get(url, params=params, headers=headers) as response:
                    body = await response.read()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                raise PullFailed(url, why) from exc
    except TimeoutError:
        raise HeartbeatMissed(url, heartbeat_window) from None
    if response.status == 200:
        return EventsReply.parse(body)
    raise refusal(url, response.status, body)


DURABLE_ONLY = ("ack_wait", "max_deliver", "max_ack_pending", "start", "create")
"""The arguments of a `DurableConsumer` that a `PullConsumer` has no use for."""


class _ConsumerFactory(type):
    """`PullConsumer(url, durable="billing", ...)` builds `DurableConsumer(url, "billing", ...)`:
    the one call that picks between the two siblings. Without `durable=` it builds a
    `PullConsumer`; neither class ever turns into the other."""

    def __call__(cls, url: str, *args: Any, durable: str | None = None, **options: Any) -> Any:
        if durable is not None:
            return DurableConsumer(url, durable, *args, **options)
        for option in DURABLE_ONLY:
            if options.get(option) is not None:
                raise InvalidOption(option, options[option],
                                    "nothing without durable= (a durable consumer)")
        return super().__call__(url, *args, **options)


class PullConsumer(Client, metaclass=_ConsumerFactory):
    """A pull consumer of the publisher at `url`, for the items of `resource` (every resource
    when None) and `sub_resources` (all when empty), narrowed to `ids` and id `prefixes`.

    It starts after the cursor `after` (the start of the retained log when None) and moves past
    each item it delivers: `cursor` is the last one, for the application to store. `on_error` is
    called with each failure the consumer retries after (PullFailed, HeartbeatMissed,
    ProtocolError); it must not block. One operation runs at a time. The credentials, `backoff`
    and `session` are every client's keyword arguments (`listener.options.ClientArgs`), or one
    `options=` value. See docs/listener.md.

    Its sibling `DurableConsumer` is a consumer whose position the publisher keeps and
    acknowledgements move; `PullConsumer(url, durable="name", ...)` builds one
    (docs/listener.md#durable-consumers).
    """

    def __init__(
        self,
        url: str,
        *,
        resource: str | None = None,
        sub_resources: Iterable[str] = (),
        ids: Iterable[str] = (),
        prefixes: Iterable[str] = (),
        after: str | None = None,
        on_error: ErrorHandler | None = None,
        options: ClientOptions | None = None,
        **client: Unpack[ClientArgs],
    ) -> None:
        super().__init__(options_of(options, client))
        self.filter = event_filter(resource, sub_resources, ids, prefixes)
        """What every pull asks for."""
        self.url = base_url(url)
        self.events_url = self.url + EVENTS
        self.backoff = self.options.backoff or Backoff()
        self.on_error = on_error
        self._cursor = after
        self._fetching = False
        self._closed = False
        self._consumption: Consumption | None = None
        self._log = log.bind(url=self.url, resource=resource)

    @property
    def cursor(self) -> str | None:
        """The cursor of the last item delivered (`after` before any): pass it as `after=` to
        resume there."""
        if self._consumption is not None:
            return self._consumption.cursor
        return self._cursor

    async def aclose(self) -> None:
        """Stop a running consume and close the HTTP session (unless it was given). The consumer
        takes no more work after it; closing again does nothing."""
        self._closed = True
        if self._consumption is not None:
            await self._consumption.aclose()
        await super().aclose()

    async def fetch(
        self,
        max_messages: int | None = None,
        *,
        max_bytes: int | None = None,
        expires: float = DEFAULT_EXPIRES,
        idle_heartbeat: float | None = None,
    ) -> list[ChangeItem]:
        """Up to `max_messages` items (or `max_bytes` bytes of them), oldest first: returns as
        soon as some arrived and the publisher has no more, or when `expires` seconds pass
        (then possibly with none). Publisher failures are retried within `expires`; the last
        one is raised if it runs out before any item came."""
        options = fetch_options(max_messages, max_bytes, expires, idle_heartbeat)
        self._check_idle()
        self._fetching = True
        try:
            loop = asyncio.get_running_loop()
            core = FetchCore(options, self.filter, self._cursor, Retrier(self.backoff),
                             loop.time())
            while (pull := core.pull(loop.time())) is not None:
                await self._exchange(pull, core)
            items = core.result()
            self._cursor = core.position  # the last item's, or the same one in a new epoch
            return items
        finally:
            self._fetching = False

    async def next(
        self, expires: float = DEFAULT_EXPIRES, *, idle_heartbeat: float | None = None
    ) -> ChangeItem | None:
        """The next item, or None when none came within `expires` seconds."""
        items = await self.fetch(1, expires=expires, idle_heartbeat=idle_heartbeat)
        return items[0] if items else None

    def consume(
        self,
        max_messages: int | None = None,
        *,
        max_bytes: int | None = None,
        threshold_messages: int | None = None,
        threshold_bytes: int | None = None,
        expires: float = DEFAULT_EXPIRES,
        idle_heartbeat: float | None = None,
    ) -> Consumption:
        """Items as an async iterator, from a buffer of up to `max_messages` items (default 500)
        or `max_bytes` bytes, pulled again when it holds `threshold_messages`/`threshold_bytes`
        or fewer (default: half). Survives publisher restarts; see `Consumption`."""
        options = consume_options(max_messages, max_bytes, threshold_messages, threshold_bytes,
                                  expires, idle_heartbeat)
        self._check_idle()
        core = ConsumeCore(options, self.filter, self._cursor, Retrier(self.backoff))
        self._consumption = Consumption(self, core)
        return self._consumption

    # --- for Consumption --------------------------------------------------------------------

    def _ended(self, consumption: Consumption) -> None:
        if self._consumption is consumption:
            self._cursor = consumption.cursor
            self._consumption = None

    def _check_idle(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if self._fetching or self._consumption is not None:
            busy = "fetch" if self._fetching else "consume (stop or drain it first)"
            raise RuntimeError(f"the consumer is busy with a {busy}")

    async def _exchange(self, pull: EventsQuery, core: FetchCore | ConsumeCore) -> None:
        """Send `pull`, the request `core` decided on, and tell it the answer or the failure;
        a failure it retries after is reported, and its backoff delay waited out here."""
        time = asyncio.get_running_loop().time
        assert core.heartbeat_deadline is not None
        self._log.debug("pull", after=pull.after, max_results=pull.max_results,
                        wait_time=pull.wait_time)
        try:
            reply = await request_events(self._http(), self.events_url,
                                         pull.to_query(), core.heartbeat_deadline,
                                         core.heartbeat_window,
                                         self._headers(self.events_url, self.url))
        except ChangefeedError as error:
            delay = core.failed(error, time())
            if delay is not None:
                report_retry(self._log, "pull failed; backing off", error, delay,
                             core.retrier.failures, self.on_error)
                await asyncio.sleep(delay)
            return
        if core.retrier.failures:
            self._log.info("pull answered again", failures=core.retrier.failures)
        self._log.debug("pulled", items=len(reply.items), more=reply.more, missed=reply.missed)
        if reply.resume_after:
            self._log.warning("the bucket began a new epoch that holds this consumer's position: "
                              "going on from it", after=pull.after, resume_after=reply.resume_after)
        core.received(reply, time())


class Consumption:
    """A running consume: `async for item in consumption` yields the items in cursor order.

    `stop()` ends it at once: buffered items are dropped, and the consumer's cursor stays at the
    last item delivered, so nothing is lost. `drain()` stops pulling, delivers what is buffered,
    then ends. Either may be called from inside the loop or from another task. A fatal failure
    (ItemsMissed, PullRejected, RetriesExhausted) is raised after the buffered items.
    `async with` (or the consumer's `aclose`) stops it on leaving.
    """

    def __init__(self, consumer: PullConsumer, core: ConsumeCore) -> None:
        self._consumer = consumer
        self._core = core
        self._task: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()
        """Set when items, a failure or the end may be there for the iterator."""
        self._wanted = asyncio.Event()
        """Set when the puller may have a request to make."""

    @property
    def cursor(self) -> str | None:
        """The cursor of the last item delivered."""
        return self._core.cursor

    @property
    def state(self) -> ConsumeState:
        return self._core.state

    @property
    def pulls(self) -> int:
        """`events` requests sent so far."""
        return self._core.pulls

    @property
    def buffered(self) -> int:
        """Items waiting in the buffer."""
        return len(self._core.buffer)

    @property
    def buffered_bytes(self) -> int:
        return self._core.buffer.bytes

    def __aiter__(self) -> Consumption:
        return self

    async def __anext__(self) -> ChangeItem:
        self._start()
        while True:
            try:
                item = self._core.take()
            except BaseException:
                await self._finish()
                raise
            if item is not None:
                self._wanted.set()
                return item
            if self._core.finished:
                await self._finish()
                raise StopAsyncIteration
            self._arrived.clear()
            await self._arrived.wait()

    async def __aenter__(self) -> Consumption:
        self._start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def stop(self) -> None:
        """End now, dropping the buffered items; the consumer is free for another operation."""
        self._core.stop()
        self._halt()
        self._consumer._ended(self)

    def drain(self) -> None:
        """Pull no more; the iterator delivers the buffered items, then ends."""
        self._core.drain()
        self._halt()

    async def aclose(self) -> None:
        """Stop, and wait for the puller to end."""
        self.stop()
        await self._finish()

    def _start(self) -> None:
        if self._task is None and self._core.state is ConsumeState.RUNNING:
            self._task = asyncio.create_task(self._pull())

    def _halt(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._arrived.set()

    async def _finish(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        self._consumer._ended(self)

    async def _pull(self) -> None:
        core = self._core
        consumer = self._consumer
        time = asyncio.get_running_loop().time
        consumer._log.info("consume started", after=core.position, options=core.options)
        try:
            while core.state is ConsumeState.RUNNING and core.failure is None:
                pull = core.pull(time())
                if pull is None:
                    self._wanted.clear()
                    await self._wanted.wait()
                    continue
                await consumer._exchange(pull, core)
                self._arrived.set()
        except Exception as exc:  # a bug: handed to the application, which raises it
            consumer._log.exception("consume failed")
            core.fail(exc)
        if core.failure is not None:
            consumer._log.error("consume ends", error=str(core.failure),
                                error_type=type(core.failure).__name__,
                                buffered=len(core.buffer))
        self._arrived.set()
