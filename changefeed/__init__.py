"""The shared core of the change feed: what the publisher and the listener both speak.

No I/O and no dependency beyond the standard library and orjson; `publisher` and `listener` build
on it and never import each other.

    changefeed.protocol   the websocket protocol: registrations, replies, items, close codes
    changefeed.cursor     cursors (bucket epoch + position) and positions in the log
    changefeed.watch      watches on exact ids and id prefixes
    changefeed.longpoll   the `events` long poll's requests and replies (ADR-075)
    changefeed.feed       the ZeroEventHub feed's requests and lines
    changefeed.durable    durable pull consumers' wire format: configuration, fetch, settle
    changefeed.deliveries what a durable consumer hands out: delivery ids, actions, outcomes
    changefeed.backoff    exponential backoff as a pure generator of delays
    changefeed.retry      which failures are retried, and after how long
    changefeed.configjs   validators shared by every config.js reader
    changefeed.errors     every exception of the project, in one hierarchy

The public surface is what `__all__` lists; tests/changefeed/test_exported_members.py pins it.
"""

from importlib.metadata import version as _distribution_version

from changefeed.backoff import Backoff
from changefeed.cursor import Cursor
from changefeed.errors import ChangefeedError
from changefeed.protocol import ChangeItem, ChangeKind, CloseCode, Registration, Resource
from changefeed.watch import Watch

__version__ = _distribution_version("changefeed")

__all__ = [
    "Backoff",
    "ChangeItem",
    "ChangeKind",
    "ChangefeedError",
    "CloseCode",
    "Cursor",
    "Registration",
    "Resource",
    "Watch",
]
