"""`changefeed outbox install | status | resync | cursor` (publisher.cli.outbox)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from click.testing import CliRunner, Result

from changefeed_cli import main
from changefeed_testing.postgres import PostgresServer
from publisher.bucket import Change, ChangeBucket, connect
from tests.publisher.outbox.rig import outbox_section
from tests.servers import PublisherProcess, RedisServer, write_config


def run(config: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["outbox", *args, "--config", str(config)])


async def sql(url: str, *statements: str) -> list[Any]:
    conn = await asyncpg.connect(url)
    try:
        return [await conn.fetch(statement) for statement in statements]
    finally:
        await conn.close()


def new_database(postgres: PostgresServer, name: str) -> str:
    asyncio.run(sql(postgres.url(), f"CREATE DATABASE {name}"))
    return postgres.url(name)


def test_install_twice_then_status(postgres: PostgresServer, tmp_path: Path) -> None:
    url = new_database(postgres, "cli_install")
    config = write_config(tmp_path / "c.js", "redis://127.0.0.1:1/0", outbox=outbox_section(url))
    first = run(config, "install")
    assert first.exit_code == 0, first.output
    assert "version 0 -> 1" in first.output
    again = run(config, "install")
    assert again.exit_code == 0 and "up to date" in again.output
    asyncio.run(sql(url, "SELECT changefeed.publish('vm', 'a', '{nic}')",
                    "SELECT changefeed.publish('vm', 'b', '{nic}')"))
    status = run(config, "status", "--json")
    assert status.exit_code == 0, status.output
    report = orjson.loads(status.output)
    assert report["backlog"] == 2 and report["deadRows"] == 0
    assert report["relayingSession"] is None and report["schemaVersion"] == 1
    assert report["oldestAgeSeconds"] >= 0
    text = run(config, "status")
    assert "backlog:   2 row(s)" in text.output and "no publisher" in text.output


def test_errors_are_the_commands(postgres: PostgresServer, tmp_path: Path) -> None:
    plain = write_config(tmp_path / "plain.js", "redis://127.0.0.1:1/0")
    result = run(plain, "status")
    assert result.exit_code == 1 and "has no `outbox` key" in result.output
    down = write_config(tmp_path / "down.js", "redis://127.0.0.1:1/0",
                        outbox={"postgres": "postgresql://u:secret@127.0.0.1:1/x"})
    result = run(down, "status")
    assert result.exit_code == 1 and "connect to the outbox's PostgreSQL" in result.output
    assert "secret" not in result.output
    url = new_database(postgres, "cli_errors")
    config = write_config(tmp_path / "c.js", "redis://127.0.0.1:1/0", outbox=outbox_section(url))
    result = run(config, "resync", "--resource", "disk")
    assert result.exit_code == 2 and "not a configured resource" in result.output


async def _stored(redis_url: str) -> tuple[dict[str, bytes], str | None]:
    bucket = ChangeBucket(connect(redis_url), "test")
    try:
        page = await bucket.page("vm", None, 100)
        return dict(zip(page.ids, page.states, strict=True)), await bucket.log.current_epoch()
    finally:
        await bucket.aclose()


async def _seed(redis_url: str, changes: Sequence[Change]) -> None:
    bucket = ChangeBucket(connect(redis_url), "test")
    try:
        await bucket.commit_many(changes)
    finally:
        await bucket.aclose()


def test_resync_by_hand_reseeds_and_renews_the_epoch(
    postgres: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    url = new_database(postgres, "cli_resync")
    config = write_config(tmp_path / "c.js", redis_server.url, outbox=outbox_section(url))
    assert run(config, "install").exit_code == 0
    asyncio.run(sql(
        url, "CREATE TABLE vms (uuid text PRIMARY KEY, state jsonb NOT NULL)",
        """INSERT INTO vms VALUES ('vm-1', '{"uuid": "vm-1", "seq": 2}'),
                                  ('vm-2', '{"uuid": "vm-2", "seq": 3}')""",
    ))
    asyncio.run(_seed(redis_server.url, [
        Change.put("vm", "vm-1", ["state"], {"uuid": "vm-1", "seq": 1}),  # older
        Change.put("vm", "vm-9", ["state"], {"uuid": "vm-9", "seq": 1}),  # gone from PostgreSQL
    ]))
    _, epoch = asyncio.run(_stored(redis_server.url))
    result = CliRunner().invoke(main, ["outbox", "resync", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "re-seeded" in result.output
    stored, renewed = asyncio.run(_stored(redis_server.url))
    seqs = {id: orjson.loads(state)["seq"] for id, state in stored.items()}
    assert seqs == {"vm-1": 2, "vm-2": 3}
    assert renewed not in (None, epoch)  # every listener resyncs


def test_cursor_waits_for_the_relay(
    postgres: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    url = new_database(postgres, "cli_cursor")
    config = write_config(tmp_path / "c.js", redis_server.url, outbox=outbox_section(url))
    assert run(config, "install").exit_code == 0
    put, dead = asyncio.run(sql(
        url, "SELECT changefeed.put('vm', 'vm-1', '{state}', '{\"uuid\": \"vm-1\"}')",
        "INSERT INTO changefeed.outbox (resource, changed_id, sub_resources, op) "
        "VALUES ('disk', 'd-1', '{size}', 'publish') RETURNING id",
    ))
    row, dead_row = str(put[0][0]), str(dead[0][0])
    waiting = run(config, "cursor", row, "vm", "vm-1", "--sub", "state", "--timeout", "0.2")
    assert waiting.exit_code == 1 and "still waits in the outbox" in waiting.output
    for resource, id in [("vm", "vm-2"), ("network", "vm-1")]:  # pending: another row's change
        wrong = run(config, "cursor", row, resource, id, "--sub", "state", "--timeout", "0.2")
        assert wrong.exit_code == 1, wrong.output
        assert (f"outbox row {row} is the change of vm 'vm-1', not of {resource} {id!r}"
                in wrong.output), wrong.output
    publisher = PublisherProcess(config).start()
    try:
        relayed = run(config, "cursor", row, "vm", "vm-1", "--sub", "state")
        assert relayed.exit_code == 0, relayed.output
        assert relayed.output.strip().count(".") == 1  # <epoch>.<position>
        wrong = run(config, "cursor", row, "vm", "vm-2", "--sub", "state")  # relayed: the log
        assert wrong.exit_code == 1, wrong.output
        assert f"outbox row {row} is the change of vm 'vm-1', not of vm 'vm-2'" in wrong.output
        wrong = run(config, "cursor", dead_row, "vm", "d-1", "--sub", "size")  # dead
        assert "is the change of disk 'd-1', not of vm 'd-1'" in wrong.output, wrong.output
        gone = run(config, "cursor", dead_row, "disk", "d-1", "--sub", "size")
        assert gone.exit_code == 1 and "unknown resource 'disk'" in gone.output
    finally:
        publisher.stop()
