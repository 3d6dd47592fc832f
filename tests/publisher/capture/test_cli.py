"""`changefeed capture install | status` (publisher.cli.capture) against real servers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson
from click.testing import CliRunner, Result

from changefeed_cli import main
from changefeed_testing.postgres import PostgresServer
from publisher.config.settings import Config
from tests.conftest import PublisherFactory
from tests.publisher.capture.rig import VMS, capture_section, sql
from tests.publisher.capture.test_stream import copied
from tests.publisher.outbox.rig import until
from tests.servers import RedisServer, write_config


def run(config: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["capture", *args, "--config", str(config)])


def test_install_names_each_wrong_setting_with_its_fix(tmp_path: Path) -> None:
    server = PostgresServer({"max_wal_senders": "0", "max_replication_slots": "0"}).start()
    try:
        sql(server.url(), "CREATE ROLE plain LOGIN", "CREATE TABLE vms (uuid text, seq int)")
        url = server.url().replace("postgres@", "plain@")
        config = write_config(tmp_path / "c.js", "redis://127.0.0.1:1/0",
                              capture=capture_section(url))
        done = run(config, "install")
        assert done.exit_code == 1
        assert done.output.splitlines() == [
            "wrong: wal_level is replica, expected logical: ALTER SYSTEM SET wal_level = "
            "logical; then restart PostgreSQL",
            'wrong: role plain is without REPLICATION, expected REPLICATION: ALTER ROLE '
            '"plain" WITH REPLICATION',
            "wrong: max_replication_slots is 0, expected at least 1 (0 used by others, 1 for "
            "slot changefeed_test): ALTER SYSTEM SET max_replication_slots = 1; then restart "
            "PostgreSQL",
            "wrong: max_wal_senders is 0, expected at least 1 (0 in use, 1 for the capture): "
            "ALTER SYSTEM SET max_wal_senders = 1; then restart PostgreSQL",
            "wrong: column public.vms.alias is missing, expected a column the mapping reads: "
            "mend config.js or the table",
            "wrong: column public.vms.nics is missing, expected a column the mapping reads: "
            "mend config.js or the table",
            "wrong: table public.vms is keyed by nothing, expected its primary key on uuid (a "
            'delete names only the key): ALTER TABLE "public"."vms" ADD PRIMARY KEY (uuid)',
            "Error: 7 setting(s) to mend first",
        ]
    finally:
        server.remove()


def test_install_publishes_the_mapped_tables_only(database: str, tmp_path: Path) -> None:
    sql(database, VMS, "CREATE TABLE unmapped (n int PRIMARY KEY)")
    config = write_config(tmp_path / "c.js", "redis://127.0.0.1:1/0",
                          capture=capture_section(database))
    first = run(config, "install")
    assert first.exit_code == 0, first.output
    assert first.output.splitlines()[0] == (
        'CREATE PUBLICATION "changefeed_test" FOR TABLE "public"."vms"')
    again = run(config, "install")
    assert again.output.splitlines()[0] == (
        'ALTER PUBLICATION "changefeed_test" SET TABLE "public"."vms"')
    assert sql(database, "SELECT schemaname, tablename FROM pg_publication_tables "
               "WHERE pubname = 'changefeed_test'") == [("public", "vms")]


async def test_status_shows_the_slot_its_lag_and_the_streaming_publisher(
    database: str, redis_server: RedisServer, make_config: Callable[..., Config],
    start_publisher: PublisherFactory, tmp_path: Path,
) -> None:
    # The command runs in a thread: it runs an event loop of its own.
    section = capture_section(database, slot="status_slot", publication="status_pub")
    config_path = write_config(tmp_path / "c.js", redis_server.url, capture=section)
    sql(database, VMS)
    assert run(config_path, "install").exit_code == 0
    missing = orjson.loads((await asyncio.to_thread(run, config_path, "status", "--json")).output)
    assert (missing["exists"], missing["streaming"]) == (False, None)
    async with start_publisher(make_config(redis_server.url, capture=section)) as service:
        await copied(service, "status_slot")
        sql(database, "INSERT INTO vms (uuid, seq) VALUES ('s1', 1)")
        assert service.capture is not None
        stats = service.capture.stats
        await until(lambda: stats.transactions >= 1, "the capture streamed")
        found = orjson.loads(
            (await asyncio.to_thread(run, config_path, "status", "--json")).output)
        assert found["exists"] and found["active"] and found["walStatus"] == "reserved"
        assert found["streaming"] == service.id
        assert isinstance(found["lagBytes"], int) and found["copied"]["epoch"]
        assert found["setAside"] == []
        text = (await asyncio.to_thread(run, config_path, "status")).output
        assert text.splitlines()[0] == "slot:      status_slot (active, WAL reserved)"
        assert f"streaming: {service.id}" in text
