"""The read options' cursors (`publisher.spark.options.source_options`): `startingCursor` and
`endingCursor` take a cursor of either kind (docs/spark.md: composite ones for a bucket in a
Redis Cluster); the bucket's layout is checked when the read is planned. Pure: no Spark job."""

from __future__ import annotations

import pytest

from changefeed.cursor import ZERO, Position, StreamId, new_epoch
from changefeed.errors import OptionError
from publisher.spark.options import source_options

TARGET = {"redisUrl": "redis+cluster://127.0.0.1:7000", "bucket": "test"}


@pytest.mark.parametrize("composite", [False, True])
def test_both_kinds_of_cursor_are_read_options(composite: bool) -> None:
    epoch = new_epoch()
    start = Position(epoch, (StreamId(5, 1), ZERO), composite) if composite \
        else Position.single(epoch, StreamId(5, 1))
    end = start.advanced(0, StreamId(9, 0)).encode()
    options = source_options({**TARGET, "startingCursor": start.encode(), "endingCursor": end})
    assert (options.start, options.end) == (start.encode(), end)


@pytest.mark.parametrize("key", ["startingCursor", "endingCursor"])
@pytest.mark.parametrize("bad", ["yesterday", f"{'a' * 8}~zz", f"{'a' * 8}.0192cc0915c6b3"])
def test_what_is_no_cursor_is_refused(key: str, bad: str) -> None:
    with pytest.raises(OptionError, match=f"option '{key}': got '{bad}'"):
        source_options({**TARGET, key: bad})
