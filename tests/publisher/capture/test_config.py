"""config.js's `capture` key (publisher.config.capture)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from changefeed.errors import ConfigError
from publisher.config.capture import Table
from publisher.config.settings import Config, parse_config
from tests.servers import write_config

URL = "postgresql://changefeed:secret@127.0.0.1:5432/vmapi"


def parse(tmp_path: Path, capture: Any) -> Config:
    path = write_config(tmp_path / "config.js", "redis://127.0.0.1:1/0", capture=capture)
    return parse_config(path.read_text(), base=tmp_path)


def test_the_issues_example(tmp_path: Path) -> None:
    capture = parse(tmp_path, {
        "postgres": URL, "slot": "changefeed", "publication": "changefeed",
        "tables": {
            "public.vms": {"resource": "vm", "id": "uuid",
                           "subResources": {"nic": ["nics"], "alias": ["alias"]}},
            "public.vmapi_vms": {"resource": "vm", "moray": True,
                                 "subResources": {"nic": ["nics"], "state": ["state"]}},
        },
    }).capture
    assert capture is not None
    assert (capture.url(), capture.display_url) == (
        URL, "postgresql://changefeed:***@127.0.0.1:5432/vmapi")
    assert (capture.slot, capture.publication) == ("changefeed", "changefeed")
    assert capture.tables == (
        Table("public", "vms", "vm", "uuid", (("nic", ("nics",)), ("alias", ("alias",)))),
        Table("public", "vmapi_vms", "vm", "_key", (("nic", ("nics",)), ("state", ("state",))),
              moray=True),
    )
    assert capture.tables[0].mapped_columns == {"uuid", "nics", "alias"}
    assert capture.tables[1].mapped_columns == {"_key", "_value"}


def test_defaults_derive_from_the_bucket(tmp_path: Path) -> None:
    capture = parse(tmp_path, {"postgresEnv": "VMAPI_PG",
                               "tables": {"vms": {"resource": "vm", "id": "uuid"}}}).capture
    assert capture is not None
    assert (capture.slot, capture.publication) == ("changefeed_test", "changefeed_test")
    assert capture.tables[0].qualified == "public.vms"
    assert capture.url({"VMAPI_PG": URL}) == URL
    with pytest.raises(ConfigError, match=r"capture\.postgresEnv"):
        capture.url({})


@pytest.mark.parametrize(("section", "key", "expected"), [
    ({"tables": {"vms": {"resource": "vm", "id": "u"}}}, "capture",
     "exactly one of postgres, postgresEnv, postgresFile"),
    ({"postgres": URL, "slots": "x"}, "capture.slots", "one of the known keys"),
    ({"postgres": URL, "tables": {}}, "capture.tables", "at least one table"),
    ({"postgres": URL, "slot": "Bad-Name", "tables": {"t": {"resource": "vm", "id": "u"}}},
     "capture.slot", "lower-case letters"),
    ({"postgres": URL, "tables": {"t": {"resource": "disk", "id": "u"}}},
     "capture.tables.t.resource", "a configured resource (network, vm)"),
    ({"postgres": URL, "tables": {"t": {"resource": "vm"}}}, "capture.tables.t.id",
     "a non-empty string"),
    ({"postgres": URL, "tables": {"t": {"resource": "vm", "moray": True, "id": "x"}}},
     "capture.tables.t.id", "a Moray table's is _key"),
    ({"postgres": URL, "tables": {"t": {"resource": "vm", "id": "u", "idx": 1}}},
     "capture.tables.t.idx", "one of the known keys"),
    ({"postgres": URL, "tables": {"t": {"resource": "vm", "id": "u",
                                        "subResources": {"disk": ["d"]}}}},
     "capture.tables.t.subResources.disk", "a sub-resource of vm (nic, alias, state)"),
    ({"postgres": URL, "tables": {"t": {"resource": "vm", "id": "u",
                                        "subResources": {"nic": []}}}},
     "capture.tables.t.subResources.nic", "a list of column names"),
    ({"postgres": "mysql://x", "tables": {"t": {"resource": "vm", "id": "u"}}},
     "capture.postgres", "a postgresql:// URL"),
])
def test_a_wrong_key_is_named(tmp_path: Path, section: Any, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(tmp_path, section)
    assert caught.value.key == key
    assert expected in caught.value.expected


def test_capture_cannot_change_while_the_publisher_runs(tmp_path: Path) -> None:
    from publisher.config.reload import fixed_changes, keep_fixed

    section = {"postgres": URL, "tables": {"vms": {"resource": "vm", "id": "uuid"}}}
    old = parse(tmp_path, section)
    new = parse(tmp_path, {**section, "slot": "other"})
    assert fixed_changes(old, new) == ["capture"]
    assert keep_fixed(old, new).capture == old.capture
