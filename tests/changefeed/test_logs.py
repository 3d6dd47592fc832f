"""The client libraries log through `logging` (changefeed/logs.py): the application's logging
configuration decides what is shown and where, and nothing goes to stdout."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import sys
from collections.abc import Iterator

import orjson
import pytest
import structlog

from changefeed.logs import event_fields, get_logger
from listener import BootstrapDone, Listener, PullConsumer
from publisher.server.service import Service
from tests.servers import scaled


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def listener_logger() -> Iterator[tuple[logging.Logger, Records]]:
    """`logging.getLogger("listener")` with a handler of the test's own, as an application
    would set it up; its level is put back afterwards."""
    logger = logging.getLogger("listener")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_record_carries_the_event_its_fields_and_the_caller(
    listener_logger: tuple[logging.Logger, Records],
) -> None:
    logger, handler = listener_logger
    logger.setLevel(logging.DEBUG)
    get_logger("listener.test").bind(url="http://h:1").info("registered", resumed=True,
                                                            reason="too far behind")
    (record,) = handler.records
    assert record.name == "listener.test" and record.levelno == logging.INFO
    assert record.getMessage() == "registered url=http://h:1 resumed=True reason='too far behind'"
    assert record.__dict__["event"] == "registered"
    assert record.__dict__["fields"] == {"url": "http://h:1", "resumed": True,
                                         "reason": "too far behind"}
    assert record.funcName == "test_a_record_carries_the_event_its_fields_and_the_caller"


def test_an_exception_is_logged_with_its_traceback(
    listener_logger: tuple[logging.Logger, Records],
) -> None:
    logger, handler = listener_logger
    logger.setLevel(logging.DEBUG)
    try:
        raise ValueError("bad")
    except ValueError:
        get_logger("listener.test").exception("reader failed", url="u")
    (record,) = handler.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.exc_info[0] is ValueError


def test_below_the_logger_level_nothing_is_handled(
    listener_logger: tuple[logging.Logger, Records],
) -> None:
    logger, handler = listener_logger
    logger.setLevel(logging.WARNING)
    log = get_logger("listener.test")
    log.debug("bootstrap page", page=1)
    log.info("registered")
    log.warning("connection failed; backing off", delay=0.5)
    assert [record.__dict__["event"] for record in handler.records] == [
        "connection failed; backing off"
    ]


def test_structlog_renders_a_record_as_one_of_its_own() -> None:
    """What `changefeed snoop` shows: the publisher's configure() puts `event_fields` into its
    foreign_pre_chain, so a listener line in JSON has the event and its fields apart."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, event_fields],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.JSONRenderer()],
    ))
    logger = logging.getLogger("listener.rendered")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        get_logger("listener.rendered").bind(attempt=1).info("registered", resumed=False)
        logger.info("a plain %s record", "stdlib")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    first, second = (orjson.loads(line) for line in out.getvalue().splitlines())
    assert first == {"event": "registered", "attempt": 1, "resumed": False,
                     "logger": "listener.rendered"}
    assert second == {"event": "a plain stdlib record", "logger": "listener.rendered"}


async def test_a_handler_on_the_listener_logger_gets_the_debug_and_info_records(
    publisher: Service, listener_logger: tuple[logging.Logger, Records],
) -> None:
    logger, handler = listener_logger
    logger.setLevel(logging.DEBUG)
    await publisher.bucket.commit("vm", "a", ["nic"], {"uuid": "a"})
    await read_a_bootstrap_and_pull(publisher.url)
    seen = {(record.name, record.__dict__["event"]) for record in handler.records}
    assert {("listener.client", "connecting"), ("listener.client", "bootstrap page"),
            ("listener.client", "bootstrap done"), ("listener.consumer", "pull")} <= seen
    (page,) = [r for r in handler.records if r.__dict__["event"] == "bootstrap page"]
    assert page.levelno == logging.DEBUG
    assert page.__dict__["fields"]["resource"] == "vm" and page.__dict__["fields"]["objects"] == 1

    handler.records.clear()
    logger.setLevel(logging.WARNING)
    await read_a_bootstrap_and_pull(publisher.url)
    assert handler.records == []


async def read_a_bootstrap_and_pull(url: str) -> None:
    async with asyncio.timeout(scaled(20)):
        async with Listener(url, instance="i-1", service="tcns",
                            resources={"vm": ["nic"]}) as feed:
            async for event in feed:
                if isinstance(event, BootstrapDone):
                    break
        async with PullConsumer(url, resource="vm") as consumer:
            await consumer.fetch(10, expires=1, idle_heartbeat=0.5)


APPLICATION = """
import asyncio, logging, sys
{setup}
from listener import BootstrapDone, Listener, PullConsumer

async def main():
    async with Listener(sys.argv[1], instance="i-1", service="tcns",
                        resources={{"vm": ["nic"]}}) as feed:
        async for event in feed:
            if isinstance(event, BootstrapDone):
                break
    async with PullConsumer(sys.argv[1], resource="vm") as consumer:
        await consumer.fetch(10, expires=1, idle_heartbeat=0.5)
    print("done")

asyncio.run(main())
"""


@pytest.mark.parametrize(("setup", "shown"), [
    ("", False),
    ("logging.basicConfig(level=logging.WARNING)", False),
    ("logging.basicConfig(level=logging.DEBUG)", True),
    ("logging.basicConfig(level=logging.DEBUG); logging.getLogger('listener').setLevel('WARNING')",
     False),
])
async def test_an_application_s_logging_configuration_decides(
    publisher: Service, setup: str, shown: bool,
) -> None:
    """stdout has only the application's print; stderr the listener's debug and info records
    only when the application's logging asks for them."""
    await publisher.bucket.commit("vm", "a", ["nic"], {"uuid": "a"})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", APPLICATION.format(setup=setup), publisher.url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(scaled(30)):
        stdout, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    assert stdout == b"done\n"
    err = stderr.decode()
    if shown:
        assert re.search(r"^DEBUG:listener.client:bootstrap page .* resource=vm page=1 objects=1$",
                         err, re.M), err
        assert "INFO:listener.client:registered" in err and "DEBUG:listener.consumer:pull" in err
    else:
        assert not re.search(r"^\w+:listener\.", err, re.M), err
        if "basicConfig(level=logging.DEBUG)" not in setup:
            assert err == ""
