"""`DurableConsumer`: a durable pull consumer of the publisher, in the manner of JetStream's
(`PullConsumer(url, durable="billing")` builds one too).

    async with DurableConsumer(url, "billing", resource="vm", ack_wait=30) as consumer:
        async for msg in consumer.consume():
            handle(msg.item)
            await msg.ack()

The publisher keeps the consumer's position in Redis and moves it only by acknowledgements:
an item not acknowledged within `ack_wait` is handed out again (to this instance or another
of the same name), up to `max_deliver` times, then goes to the consumer's dead-letter record.
Every settlement (`ack`, `nak`, `in_progress`, `term`) says whether it took effect
(`changefeed.durable.Settled`). The wire formats are `changefeed.durable`'s, whether to retry
`changefeed.retry`'s; this module sends the requests, sleeps and logs. docs/listener.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, TypeVar, Unpack

import aiohttp
import orjson

from changefeed.backoff import Backoff
from changefeed.durable import (
    DURABLE,
    FIRST,
    NAME,
    Action,
    ConsumerConfig,
    DeliveryId,
    FetchReply,
    FetchRequest,
    Message,
    Settled,
    SettleReply,
    SettleRequest,
    filter_to_wire,
)
from changefeed.errors import (
    ChangefeedError,
    ConsumerRecreated,
    HeartbeatMissed,
    InvalidOption,
    PullFailed,
)
from changefeed.logs import get_logger
from changefeed.protocol import ChangeItem
from changefeed.retry import Retrier
from listener.consumer_options import DEFAULT_EXPIRES, MIN_EXPIRES, event_filter
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

T = TypeVar("T")

MARGIN = 5.0
"""Seconds a request may take beyond the long poll's wait before it counts as a missed
heartbeat (ADR-37: the client's timeout is longer than the server's expiry)."""
DEFAULT_BATCH = 100
"""Messages one `consume` pull asks for by default."""


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> bytes:
    """One request with a JSON body, answered within `timeout` seconds.

    The one place where aiohttp's errors and the statuses of the durable routes become the
    consumer's: 2xx is returned, 401/403 raise AccessDenied and other 4xx PullRejected (not
    retried), 5xx and no answer PullFailed (retried), silence HeartbeatMissed (a warning).
    """
    data = None if body is None else orjson.dumps(body)
    send = {"Content-Type": "application/json", **(headers or {})}
    try:
        async with asyncio.timeout(timeout):
            try:
                async with session.request(method, url, data=data, headers=send) as response:
                    payload = await response.read()
            except (aiohttp.ClientError, OSError) as exc:
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                raise PullFailed(url, why) from exc
    except TimeoutError:
        raise HeartbeatMissed(url, timeout) from None
    if 200 <= response.status < 300:
        return payload
    raise refusal(url, response.status, payload)


class Msg:
    """An item handed out by a durable consumer, to settle once handled.

    `item` is the change item; `deliveries` how many times it has been handed out (1 the first
    time); `delivery` names this hand-out. Each settlement returns a `Settled` that says whether
    it took effect (`applied`) and, when not, why (`outcome`): an ack after the item was handed
    out again is not applied, and the newer delivery's holder must settle it.
    """

    __slots__ = ("_consumer", "deliveries", "delivery", "item")

    def __init__(self, consumer: DurableConsumer, message: Message) -> None:
        self._consumer = consumer
        self.item: ChangeItem = message.item
        self.delivery = message.delivery
        self.deliveries = message.deliveries

    @property
    def cursor(self) -> str:
        return self.item.cursor

    def __repr__(self) -> str:
        return f"Msg({self.item.cursor!r}, deliveries={self.deliveries})"

    async def ack(self) -> Settled:
        """Done: the item is never handed out again."""
        return (await self._consumer.settle(Action.ACK, [self]))[0]

    async def nak(self, delay: float = 0.0) -> Settled:
        """Not done: hand it out again after `delay` seconds (0: at once)."""
        return (await self._consumer.settle(Action.NAK, [self], delay=delay))[0]

    async def in_progress(self) -> Settled:
        """Still working on it: its ack wait starts again from now."""
        return (await self._consumer.settle(Action.IN_PROGRESS, [self]))[0]

    async def term(self) -> Settled:
        """Never to be done: it goes to the dead-letter record (reason `terminated`)."""
        return (await self._consumer.settle(Action.TERM, [self]))[0]


class DurableConsumer(Client):
    """An instance of the durable consumer `durable` of the publisher at `url`.

    The consumer is created on first use with the configuration given here (`resource`,
    `sub_resources`, `ids`, `prefixes`, `ack_wait`, `max_deliver`, `max_ack_pending`, `start`);
    if it exists with another, the publisher refuses (PullRejected, code `ConsumerExists`),
    since a consumer's configuration is fixed when it is created. With `create=False` it must
    exist already. Several instances of one name share its work: each item is handed to one at
    a time. Failures of the publisher are retried after `backoff` delays (`on_error` is told
    each); a request other than a fetch's long poll waits at most `http_timeout` seconds (30).
    The credentials, `backoff`, `http_timeout` and `session` are every client's keyword
    arguments (`listener.options.ClientArgs`), or one `options=` value. `PullConsumer(url,
    durable=name, ...)` builds one too.
    """

    def __init__(
        self,
        url: str,
        durable: str,
        *,
        resource: str | None = None,
        sub_resources: Iterable[str] = (),
        ids: Iterable[str] = (),
        prefixes: Iterable[str] = (),
        ack_wait: float | None = None,
        max_deliver: int | None = None,
        max_ack_pending: int | None = None,
        start: str = FIRST,
        create: bool = True,
        on_error: ErrorHandler | None = None,
        options: ClientOptions | None = None,
        **client: Unpack[ClientArgs],
    ) -> None:
        if not isinstance(durable, str) or not NAME.match(durable):
            raise InvalidOption("durable", durable, "1 to 50 letters, digits, '_', '.' or '-'")
        super().__init__(options_of(options, client))
        self.url = base_url(url)
        self.name = durable
        self.base_url = f"{self.url}{DURABLE}/{durable}"
        self.filter = event_filter(resource, sub_resources, ids, prefixes)
        self.config: dict[str, Any] = {"filter": filter_to_wire(self.filter), "start": start}
        """The configuration sent when the consumer is created (the publisher fills in the
        defaults of what is left out)."""
        for key, value in (("ack_wait", ack_wait), ("max_deliver", max_deliver),
                           ("max_ack_pending", max_ack_pending)):
            if value is not None:
                self.config[key] = value
        self.create = create
        self.backoff = self.options.backoff or Backoff()
        self.timeout = self.options.http_timeout or DEFAULT_EXPIRES
        """Seconds for a request other than a fetch's long poll."""
        self.on_error = on_error
        self._ready = False
        self._closed = False
        self._incarnation: str | None = None
        """The incarnation of the consumer this instance uses: another one later means it was
        created again (`ConsumerRecreated`)."""
        self._recreated: ConsumerRecreated | None = None
        self._log = log.bind(url=self.url, durable=durable)

    async def aclose(self) -> None:
        """Close the HTTP session (unless it was given). Unsettled messages are handed out again
        once their ack wait passes."""
        self._closed = True
        await super().aclose()

    # --- the consumer on the publisher --------------------------------------------------------

    async def ensure(self) -> dict[str, Any]:
        """Create the consumer (or, with `create=False`, find it); its info."""
        if self.create:
            body = await self._call("PUT", self.base_url, self.config, self.timeout)
        else:
            body = await self._call("GET", self.base_url, None, self.timeout)
        self._ready = True
        info: dict[str, Any] = orjson.loads(body)
        incarnation = info.get("incarnation")
        if isinstance(incarnation, str):
            if self._incarnation is not None and incarnation != self._incarnation:
                self._recreated = ConsumerRecreated(self.name, self._incarnation, incarnation)
                self._log.warning("the durable consumer was created again: items may have "
                                  "been missed", before=self._incarnation, now=incarnation)
            self._incarnation = incarnation
        return info

    async def info(self) -> dict[str, Any]:
        """The consumer's configuration, position, pending count and counters."""
        info: dict[str, Any] = orjson.loads(
            await self._call("GET", self.base_url, None, self.timeout)
        )
        return info

    async def configuration(self) -> ConsumerConfig:
        """The configuration as this instance asks for it, with the publisher's defaults."""
        info = await self.ensure()
        wire = info["config"]
        return ConsumerConfig(self.filter, float(wire["ack_wait"]), int(wire["max_deliver"]),
                              int(wire["max_ack_pending"]), str(wire["start"]))

    async def delete(self) -> None:
        """Delete the consumer on the publisher, with its position, pending items and
        dead-letter record (every instance's deliveries become `consumer_recreated`)."""
        await self._call("DELETE", self.base_url, None, self.timeout)
        self._ready = False

    async def dead_letters(self, after: str | None = None, limit: int = 100) -> dict[str, Any]:
        """Records of the dead-letter record after record id `after` (`records`, `more`,
        `dropped`)."""
        query = f"?limit={limit}" + (f"&after={after}" if after else "")
        record: dict[str, Any] = orjson.loads(
            await self._call("GET", self.base_url + "/dead" + query, None, self.timeout)
        )
        return record

    # --- fetching -----------------------------------------------------------------------------

    async def fetch(self, max_messages: int = DEFAULT_BATCH, *,
                    expires: float = DEFAULT_EXPIRES) -> list[Msg]:
        """Up to `max_messages` messages (redeliveries first): returns as soon as there are
        some, or after `expires` seconds with none. Publisher failures are retried within
        `expires`; the last one is raised if it runs out. ConsumerRecreated (once) when the
        consumer met since the last fetch is a new one of this name."""
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise InvalidOption("max_messages", max_messages, "an integer >= 1")
        if isinstance(expires, bool) or not isinstance(expires, int | float) or expires < 0:
            raise InvalidOption("expires", expires, "a number of seconds >= 0")
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + expires
        retrier = Retrier(self.backoff)
        while True:
            remaining = max(0.0, deadline - loop.time())
            try:
                if not self._ready:
                    await self.ensure()
                if self._recreated is not None:
                    recreated, self._recreated = self._recreated, None
                    raise recreated
                body = await request_json(
                    self._http(), "POST", self.base_url + "/fetch",
                    FetchRequest(max_messages, remaining).to_wire(), remaining + MARGIN,
                    self._durable_headers(),
                )
                reply = FetchReply.parse(body)
            except ChangefeedError as error:
                delay = retrier.failed(error)  # raises what is not retried
                if loop.time() + delay >= deadline and not isinstance(error, HeartbeatMissed):
                    raise
                self._report(error, delay, retrier)
                await asyncio.sleep(delay)
                continue
            if reply.dead_lettered:
                self._log.warning("items went to the dead-letter record",
                                  count=reply.dead_lettered)
            return [Msg(self, message) for message in reply.messages]

    async def next(self, expires: float = DEFAULT_EXPIRES) -> Msg | None:
        """The next message, or None when none came within `expires` seconds."""
        messages = await self.fetch(1, expires=expires)
        return messages[0] if messages else None

    async def consume(
        self, max_messages: int = DEFAULT_BATCH, *, expires: float = DEFAULT_EXPIRES
    ) -> AsyncIterator[Msg]:
        """Messages as they come, fetched `max_messages` at a time (each long poll waits up to
        `expires` seconds), until the consumer is closed. A message's ack wait runs from its
        fetch: keep `max_messages` to what is handled within `ack_wait`."""
        if isinstance(expires, bool) or not isinstance(expires, int | float) or not (
            expires >= MIN_EXPIRES
        ):
            raise InvalidOption("expires", expires, f"a number of seconds >= {MIN_EXPIRES:g}")
        while not self._closed:
            for msg in await self.fetch(max_messages, expires=expires):
                yield msg

    # --- settling -----------------------------------------------------------------------------

    async def settle(
        self, action: Action, messages: Sequence[Msg | str], *, delay: float = 0.0
    ) -> list[Settled]:
        """Settle several messages (or delivery ids) with one request; a result per message.

        Failures of the publisher are retried with backoff. A retry after an answer that never
        came (a lost connection, 503 `OutcomeUnknown`) may find the delivery settled by the
        attempt that went unanswered: it then answers `not_pending`, which is as much as can be
        known."""
        if not messages:
            return []
        deliveries = tuple(
            DeliveryId.decode(m if isinstance(m, str) else m.delivery) for m in messages
        )
        request = SettleRequest(deliveries, delay if action is Action.NAK else 0.0)
        retrier = Retrier(self.backoff)
        while True:
            try:
                body = await request_json(
                    self._http(), "POST", f"{self.base_url}/{action.value}",
                    request.to_wire(), self.timeout, self._durable_headers(),
                )
                return list(SettleReply.parse(body).results)
            except ChangefeedError as error:
                delay_s = retrier.failed(error)  # raises what is not retried
                self._report(error, delay_s, retrier)
                await asyncio.sleep(delay_s)

    async def ack(self, messages: Sequence[Msg | str]) -> list[Settled]:
        """Acknowledge several messages at once."""
        return await self.settle(Action.ACK, messages)

    # --- plumbing -----------------------------------------------------------------------------

    async def _call(self, method: str, url: str, body: Any, timeout: float) -> bytes:
        """A request retried with backoff on failures that may pass."""
        retrier = Retrier(self.backoff)
        while True:
            try:
                return await request_json(self._http(), method, url, body, timeout,
                                          self._durable_headers())
            except ChangefeedError as error:
                delay = retrier.failed(error)
                self._report(error, delay, retrier)
                await asyncio.sleep(delay)

    def _report(self, error: ChangefeedError, delay: float, retrier: Retrier) -> None:
        report_retry(self._log, "durable consumer request failed; backing off", error, delay,
                     retrier.failures, self.on_error)

    def _durable_headers(self) -> dict[str, str]:
        return self._headers(self.base_url, self.url)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")


__all__ = ["DEFAULT_BATCH", "MARGIN", "DurableConsumer", "Msg", "request_json"]
