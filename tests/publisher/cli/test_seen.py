"""`changefeed publish --wait-seen-by` (issue 17, item 1): the pure count, then the command as a
real subprocess against a real publisher with real websocket listeners."""

from __future__ import annotations

import time
from pathlib import Path

from changefeed.cursor import Position
from publisher.cli.seen import parse_wait_seen_by, seen_by
from publisher.server.service import Service
from tests.publisher.cli.test_cli import changefeed
from tests.servers import RedisServer, write_config
from tests.wsclient import register, v1, v2

C = Position.decode("abcdefghij.0192f3a4b5c6a3")


def reg(service: str, subs: list[str], sent: str | None, **kind: list[str]) -> dict[str, object]:
    return {"service": service, "instance": f"i-{subs}-{sent}", "publisher": "p",
            "changeKind": {"resource": "vm", "subResources": subs, **kind},
            "lastCursorSent": sent}


def test_only_listeners_the_item_is_for_count() -> None:
    later = Position.single(C.epoch, type(C.position)(C.position.ms + 1, 0)).encode()
    foreign = Position.single("zzzzzzzzzz", C.position).encode()
    registrations = [
        reg("tcns", ["nic"], str(C)),
        reg("tcns", ["*"], later),
        reg("tcns", ["alias"], later),  # not for the item: never counts
        reg("tcns", ["nic"], None),  # for it, not sent yet
        reg("tcns", ["nic"], foreign),
        reg("tcns", ["nic"], later, ids=["vm-2"]),  # a watch that excludes the item
        reg("napi", ["nic"], later),
    ]
    assert seen_by(registrations, "tcns", "vm", ["nic"], "vm-1", C) == (4, 2)
    assert parse_wait_seen_by("tcns") == ("tcns", 1)
    assert parse_wait_seen_by("tcns,3") == ("tcns", 3)


async def test_publish_waits_until_the_listeners_were_sent_the_item(
    publisher: Service, tmp_path: Path, redis_server: RedisServer
) -> None:
    nic = await register(publisher.ws_url, v1("vm", ["nic"]))  # service tcns
    star = await register(publisher.ws_url, v1("vm", ["*"], instance="i-2"))
    alias = await register(publisher.ws_url, v1("vm", ["alias"], instance="i-3"))
    other = await register(publisher.ws_url, v2({"vm": ["*"]}), "~2")  # service napi
    config = write_config(tmp_path / "cli.js", redis_server.url)
    started = time.monotonic()
    status, output = await changefeed(
        "publish", "--config", str(config), "vm", "vm-1", "--sub", "nic",
        "--wait-seen-by", "tcns,2", "--url", publisher.url,
    )
    assert status == 0, output
    cursor = output.strip().splitlines()[0]
    assert "sent to 2 listener(s) of tcns" in output
    assert (await nic.next())["cursor"] == cursor and (await star.next())["cursor"] == cursor
    assert (await other.next())["cursor"] == cursor
    status, output = await changefeed(
        "publish", "--config", str(config), "vm", "vm-1", "--sub", "nic",
        "--wait-seen-by", "tcns,3", "--wait-timeout", "0.5", "--url", publisher.url,
    )
    assert status == 1, output
    assert "sent to 2 of the 3 listener(s) of tcns" in output
    assert "2 registered listener(s) of tcns are for this item" in output
    print("publish --wait-seen-by took", round(time.monotonic() - started, 2), "s")
    for feed in (nic, star, alias, other):
        await feed.close()
