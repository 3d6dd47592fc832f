"""config.js's `outbox` key (publisher.config.outbox)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from changefeed.errors import ConfigError
from publisher.config.settings import Config, parse_config
from tests.servers import write_config


def parse(tmp_path: Path, outbox: Any) -> Config:
    path = write_config(tmp_path / "config.js", "redis://127.0.0.1:1/0", outbox=outbox)
    return parse_config(path.read_text(), base=tmp_path)


def test_absent_means_no_relay(tmp_path: Path) -> None:
    path = write_config(tmp_path / "config.js", "redis://127.0.0.1:1/0")
    assert parse_config(path.read_text()).outbox is None


def test_a_url_its_snapshots_and_knobs(tmp_path: Path) -> None:
    config = parse(tmp_path, {
        "postgres": "postgresql://svc:secret@db:5432/svc", "pollInterval": 0.5, "batch": 200,
        "resources": {"vm": {"snapshot": "SELECT uuid, to_jsonb(v) FROM vms v"}},
    })
    outbox = config.outbox
    assert outbox is not None
    assert outbox.url() == "postgresql://svc:secret@db:5432/svc"
    assert outbox.display_url == "postgresql://svc:***@db:5432/svc"
    assert outbox.snapshot == {"vm": "SELECT uuid, to_jsonb(v) FROM vms v"}
    assert (outbox.poll_interval, outbox.batch) == (0.5, 200)


def test_the_url_from_the_environment_or_a_file(tmp_path: Path) -> None:
    outbox = parse(tmp_path, {"postgresEnv": "SVC_PG"}).outbox
    assert outbox is not None
    assert outbox.url({"SVC_PG": "postgresql://h/db\n"}) == "postgresql://h/db"
    with pytest.raises(ConfigError, match=r"outbox\.postgresEnv"):
        outbox.url({})
    (tmp_path / "pg.url").write_text("postgresql://u:pw@h/db\n")
    outbox = parse(tmp_path, {"postgresFile": "pg.url"}).outbox
    assert outbox is not None
    assert outbox.url() == "postgresql://u:pw@h/db"
    (tmp_path / "pg.url").write_text("mysql://u:pw@h/db\n")
    with pytest.raises(ConfigError) as error:
        outbox.url()
    assert "pw" not in str(error.value)


@pytest.mark.parametrize(
    ("outbox", "key"),
    [
        ({}, "outbox"),
        ({"postgres": "postgresql://h/d", "postgresEnv": "X"}, "outbox"),
        ({"postgres": "http://u:pw@h/d"}, "outbox.postgres"),
        ({"postgresEnv": "not a name"}, "outbox.postgresEnv"),
        ({"postgres": "postgresql://h/d", "poll": 1}, "outbox.poll"),
        ({"postgres": "postgresql://h/d", "batch": 0}, "outbox.batch"),
        ({"postgres": "postgresql://h/d", "resources": {"disk": {"snapshot": "x"}}},
         "outbox.resources.disk"),
        ({"postgres": "postgresql://h/d", "resources": {"vm": {"snapshot": ""}}},
         "outbox.resources.vm.snapshot"),
    ],
)
def test_errors_name_the_key_and_hide_passwords(tmp_path: Path, outbox: Any, key: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(tmp_path, outbox)
    assert error.value.key == key
    assert "pw" not in str(error.value)
