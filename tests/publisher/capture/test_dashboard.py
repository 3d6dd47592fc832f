"""The dashboard's PostgreSQL table in a real browser: two publishers, each with the capture and
the outbox of one private PostgreSQL; the page must show which one streams the slot (its lag in
bytes and seconds) and which one relays the outbox (its backlog), and the other as standby."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from changefeed_testing.postgres import PostgresServer
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.publisher.capture.rig import prepare, section_of
from tests.publisher.capture.test_stream import copied
from tests.publisher.outbox import rig as outbox_rig
from tests.publisher.outbox.rig import until
from tests.publisher.web.test_dashboard import CHROMIUM, chromium
from tests.servers import RedisServer

NONE = "\u2013"
"""What the page shows for a figure that does not apply (an en dash)."""
ROW = r"<tr><td>{publisher}</td><td>{reads}</td><td[^>]*>{state}</td>(.*?)</tr>"


def cells(dom: str, publisher: str, reads: str, state: str) -> list[str]:
    """The rest of the PostgreSQL table's row of `publisher` reading `reads` in `state`."""
    row = re.search(ROW.format(publisher=publisher, reads=reads, state=state), dom)
    assert row is not None, f"no {reads} row of {publisher} {state}: {dom[:4000]}"
    return re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
async def test_the_dashboard_shows_the_capture_lag_and_the_outbox_backlog(
    database: str, logical_postgres: PostgresServer, redis_server: RedisServer,
    make_config: Callable[..., Config], start_publisher: PublisherFactory,
) -> None:
    capture = prepare(database)
    outbox_database = await outbox_rig.fresh_database(logical_postgres.url())
    config = make_config(
        redis_server.url, fleet={"interval": 0.2, "ttl": 2},
        capture=section_of(capture, database), outbox=outbox_rig.outbox_section(outbox_database),
    )
    async with start_publisher(config) as a, start_publisher(config) as b:
        await copied(a, capture.slot)
        streaming = next(s for s in (a, b) if s.capture and s.capture.stats.streaming)
        assert streaming.capture is not None
        stats = streaming.capture.stats
        await until(lambda: stats.lag_bytes is not None, "the capture's lag was read")
        await until(lambda: any(s.relay and s.relay.stats.status for s in (a, b)),
                    "the relaying publisher read the outbox's status")
        relaying = next(s for s in (a, b) if s.relay and s.relay.stats.relaying)
        dom = (await chromium("--virtual-time-budget=6000", "--dump-dom",
                              a.url + "/changefeeds/dashboard")).decode()
    standby = b if streaming is a else a
    lag_bytes, lag_seconds, backlog, aside, pg_errors, bucket_errors = cells(
        dom, streaming.id, "capture", "streaming")
    assert lag_bytes.isdigit(), lag_bytes
    assert re.fullmatch(r"\d+\.\d\d", lag_seconds), lag_seconds
    assert (backlog, aside, pg_errors, bucket_errors) == (NONE, "0", "0", "0")
    assert cells(dom, standby.id, "capture", "standby")[:2] == [NONE, NONE]
    age, backlog = cells(dom, relaying.id, "outbox", "relaying")[1:3]
    assert backlog == "0" and re.fullmatch(NONE + r"|\d+\.\d\d", age), (age, backlog)
    assert cells(dom, (b if relaying is a else a).id, "outbox", "standby")
    assert ">no publisher reads PostgreSQL</td>" not in dom  # the page's script holds the words
