"""The pull consumer's decisions (JetStream ADR-37 over the `events` long poll): pure code, no
sockets, clocks or sleeps. Times are numbers the I/O layer (`listener.consumer`) passes in; the
options come validated from `listener.consumer_options`, the requests and replies are
`changefeed.longpoll`'s, the retries `changefeed.retry`'s.

    FetchCore (one fetch or next)             ConsumeCore (one consume)
        pull(now)      -> EventsQuery | None      pull(now)      -> EventsQuery | None (not now)
        received(reply, now)                      received(reply, now)
        failed(error, now) -> delay | None        failed(error, now) -> delay | None
        heartbeat_deadline                        heartbeat_deadline
        result()       -> the items               take()         -> the next item, or None
                                                  stop(), drain(), finished

The ADR's pull request maps onto long polls: one `GET` waits at most `idle_heartbeat` seconds, and
its answer, empty or not, is the heartbeat (our server cannot send one in the middle of a poll).
An answer that does not come within twice `idle_heartbeat` is a missed heartbeat: reported, and
the consumer pulls again at once, without spending a retry (ADR-37 calls it a warning). `events`
has no byte limit, so `max_bytes` is honoured on what the consumer keeps: it asks for an
estimate (the room left over the largest item seen), keeps the items that fit and drops the
rest, which the next pull asks for again.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator, Sequence

from changefeed.errors import ChangefeedError, ItemsMissed
from changefeed.longpoll import MAX_RESULTS, MAX_WAIT, EventFilter, EventsQuery, EventsReply
from changefeed.protocol import ChangeItem
from changefeed.retry import Retrier
from listener.consumer_options import ConsumeOptions, FetchOptions

ITEM_SIZE_GUESS = 256
"""Bytes per item assumed for a `max_bytes` pull before any item has been seen."""
SHORTEST_WAIT = 0.001
"""A fetch with less time than this left is over."""


def item_size(item: ChangeItem) -> int:
    """The size `max_bytes` counts: the bytes of the item as on the wire (its JSON)."""
    return len(item.encode())


# --- the parts every pull shares --------------------------------------------------------------


class Batch:
    """Items held against one limit, `max_messages` or `max_bytes`, in cursor order.

    With `max_bytes` the batch keeps at least one item (one bigger than the limit would stall
    the consumer for ever otherwise), and remembers the size of the first item it had to drop:
    no pull is worth making until there is room for it.
    """

    def __init__(self, max_messages: int | None, max_bytes: int | None) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: deque[tuple[ChangeItem, int]] = deque()
        self._largest = 0
        self._blocked_by: int | None = None
        """Size of the next item, known because it did not fit."""

    def __len__(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        return self.wanted() == 0

    def wanted(self) -> int:
        """How many items to ask for so that the batch fills (an estimate with max_bytes)."""
        if self.max_bytes is None:
            assert self.max_messages is not None
            return max(0, min(self.max_messages - len(self._items), MAX_RESULTS))
        room = self.max_bytes - self.bytes
        if self._items and (room <= 0 or (self._blocked_by or 0) > room):
            return 0
        return max(1, min(room // (self._largest or ITEM_SIZE_GUESS), MAX_RESULTS))

    def add(self, items: Sequence[ChangeItem]) -> int:
        """Keep what fits of `items`, in order; returns how many were kept."""
        kept = 0
        for item in items:
            size = item_size(item)
            if self.max_bytes is None:
                assert self.max_messages is not None
                fits = len(self._items) < self.max_messages
            else:
                fits = not self._items or self.bytes + size <= self.max_bytes
            if not fits:
                self._blocked_by = size
                break
            self._items.append((item, size))
            self.bytes += size
            self._largest = max(self._largest, size)
            self._blocked_by = None
            kept += 1
        return kept

    def pop(self) -> ChangeItem | None:
        if not self._items:
            return None
        item, size = self._items.popleft()
        self.bytes -= size
        return item

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
        self._blocked_by = None

    def __iter__(self) -> Iterator[ChangeItem]:
        return (item for item, _ in self._items)


class Puller:
    """One request at a time, its heartbeat deadline, and the failure that ends the pulling."""

    def __init__(
        self, filter: EventFilter, after: str | None, idle_heartbeat: float, retrier: Retrier
    ) -> None:
        self.filter = filter
        """What every request asks for."""
        self.position = after
        """The cursor the next request asks after: the last item kept."""
        self.idle_heartbeat = idle_heartbeat
        self.retrier = retrier
        self.failure: Exception | None = None
        """Why pulling ended: raised to the application once the items kept are delivered."""
        self.pulls = 0
        """Requests sent."""
        self.in_flight: EventsQuery | None = None
        self._sent_at = 0.0

    def fail(self, error: Exception) -> None:
        """End the pulling with `error` (a bug of the I/O layer's, handed to the application)."""
        self.failure = error

    @property
    def heartbeat_window(self) -> float:
        """ADR-37: a missed heartbeat is reported after twice the idle heartbeat."""
        return 2 * self.idle_heartbeat

    @property
    def heartbeat_deadline(self) -> float | None:
        """When the request in flight counts as a missed heartbeat (None: none in flight)."""
        if self.in_flight is None:
            return None
        return self._sent_at + self.heartbeat_window

    def _send(self, max_results: int, wait_time: float, now: float) -> EventsQuery:
        assert self.in_flight is None, "one request at a time"
        self.in_flight = EventsQuery(self.filter, self.position, max_results, wait_time)
        self._sent_at = now
        self.pulls += 1
        return self.in_flight

    def _answered(self, reply: EventsReply, batch: Batch) -> int:
        """Keep what fits of the answer to the request in flight; returns how many."""
        pull, self.in_flight = self.in_flight, None
        assert pull is not None, "an answer without a request"
        self.retrier.answered()
        if reply.missed and reply.resume_after and not reply.items:
            # A new epoch of the bucket holds this position's entry: nothing was lost, and the
            # next request asks after the same position in the new epoch.
            self.position = reply.resume_after
            return 0
        if reply.missed:
            self.failure = ItemsMissed(pull.after, reply.oldest, reply.missed_reason)
            return 0
        kept = batch.add(reply.items)
        if kept:
            self.position = reply.items[kept - 1].cursor
        return kept

    def _failed(self, error: ChangefeedError, now: float) -> float | None:
        """The delay before retrying (0 after a missed heartbeat, which costs no retry), or None
        when `error` ends the pulling (self.failure)."""
        self.in_flight = None
        try:
            return self.retrier.failed(error, now)
        except ChangefeedError as fatal:
            self.failure = fatal
            return None


# --- fetch and next ---------------------------------------------------------------------------


class FetchCore(Puller):
    """One fetch: pulls until it has items and the publisher has no more, the batch is full, a
    failure, or `expires` runs out. A failure after some items ends the fetch with those items
    (the next fetch meets it again); before any, it is raised."""

    def __init__(
        self,
        options: FetchOptions,
        filter: EventFilter,
        after: str | None,
        retrier: Retrier,
        now: float,
    ) -> None:
        super().__init__(filter, after, options.idle_heartbeat, retrier)
        self.options = options
        self.deadline = now + options.expires
        self.batch = Batch(options.max_messages, options.max_bytes)
        self._more = True
        self._over = False

    def pull(self, now: float) -> EventsQuery | None:
        """The next request, or None when the fetch is over."""
        left = self.deadline - now
        if (self._over or self.failure is not None or left < SHORTEST_WAIT or self.batch.full
                or (len(self.batch) and not self._more)):
            self._over = True
            return None
        return self._send(self.batch.wanted(), min(self.idle_heartbeat, left), now)

    def received(self, reply: EventsReply, now: float) -> None:
        kept = self._answered(reply, self.batch)
        self._more = reply.more or kept < len(reply.items)

    def failed(self, error: ChangefeedError, now: float) -> float | None:
        """The delay before retrying, or None: the fetch is over (result() says how)."""
        delay = self._failed(error, now)
        if delay is None:
            return None
        if len(self.batch):
            self._over = True  # end with what we have: the next fetch meets the failure again
            return None
        if now + delay >= self.deadline:
            self.failure = error  # the publisher could not be reached within expires
            return None
        return delay

    def result(self) -> list[ChangeItem]:
        """The items fetched; raises the failure when it came before any."""
        if not len(self.batch) and self.failure is not None:
            raise self.failure
        return list(self.batch)


# --- consume ----------------------------------------------------------------------------------


class ConsumeState(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining"
    """No more pulls: the buffered items are delivered, then the consume ends."""
    STOPPED = "stopped"
    """Ended by stop(): buffered items dropped."""
    DONE = "done"
    """Ended: drained, or its failure was raised."""


class ConsumeCore(Puller):
    """One consume: a buffer kept filled up to its limit, refilled at its threshold (ADR-37).

    The cursor is that of the last item taken (delivered), so that a stopped consume loses
    nothing: what was buffered and dropped is pulled again by whatever starts after it.
    """

    def __init__(
        self, options: ConsumeOptions, filter: EventFilter, after: str | None, retrier: Retrier
    ) -> None:
        super().__init__(filter, after, options.idle_heartbeat, retrier)
        self.options = options
        self.cursor = after
        self.state = ConsumeState.RUNNING
        self.buffer = Batch(options.max_messages, options.max_bytes)

    @property
    def finished(self) -> bool:
        """Nothing more will be delivered."""
        if self.state is ConsumeState.DRAINING:
            return not len(self.buffer) and self.failure is None
        return self.state in (ConsumeState.STOPPED, ConsumeState.DONE)

    def low(self) -> bool:
        """The buffer is at or below its threshold (the low watermark)."""
        if self.options.threshold_bytes is not None:
            return self.buffer.bytes <= self.options.threshold_bytes
        assert self.options.threshold_messages is not None
        return len(self.buffer) <= self.options.threshold_messages

    def pull(self, now: float) -> EventsQuery | None:
        """The next request, or None when none is due (in flight, above the threshold, full,
        ended or failed). Each long poll waits `idle_heartbeat`: its answer is the heartbeat."""
        if (self.state is not ConsumeState.RUNNING or self.failure is not None
                or self.in_flight is not None or not self.low() or self.buffer.full):
            return None
        return self._send(self.buffer.wanted(), min(self.idle_heartbeat, MAX_WAIT), now)

    def received(self, reply: EventsReply, now: float) -> int:
        """The answer to the request in flight: keeps what fits; returns how many."""
        if self.state is not ConsumeState.RUNNING:
            self.in_flight = None
            return 0
        kept = self._answered(reply, self.buffer)
        if reply.resume_after and self.position == reply.resume_after and not len(self.buffer):
            self.cursor = self.position  # the same position, in the bucket's new epoch
        return kept

    def failed(self, error: ChangefeedError, now: float) -> float | None:
        """The delay before the next pull, or None when the failure ends the consume: it is
        raised from take() once the buffered items are delivered."""
        return self._failed(error, now)

    def take(self) -> ChangeItem | None:
        """The next item for the application (the cursor moves to it); None when there is none
        now (see `finished`). Raises the failure that ended the pulling once the buffer is empty.
        """
        if self.state in (ConsumeState.STOPPED, ConsumeState.DONE):
            return None
        item = self.buffer.pop()
        if item is not None:
            self.cursor = item.cursor
            return item
        if self.failure is not None:
            self.state = ConsumeState.DONE
            raise self.failure
        if self.state is ConsumeState.DRAINING:
            self.state = ConsumeState.DONE
        return None

    def stop(self) -> None:
        """End now; the buffered items are dropped (the cursor stays at the last delivered)."""
        if self.state is not ConsumeState.DONE:
            self.state = ConsumeState.STOPPED
        self.buffer.clear()
        self.in_flight = None

    def drain(self) -> None:
        """Pull no more; deliver what is buffered, then end."""
        if self.state is ConsumeState.RUNNING:
            self.state = ConsumeState.DRAINING
            self.in_flight = None
