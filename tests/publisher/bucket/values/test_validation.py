"""`Validator`: pure, no server."""

from __future__ import annotations

import pytest

from changefeed.errors import ChangeError
from changefeed.protocol import Resource
from changefeed.watch import MAX_ID_BYTES
from publisher.bucket import Change
from publisher.bucket.values.validation import Validator

RESOURCES = [Resource("vm", ("nic", "alias"), "/vms")]


@pytest.mark.parametrize(("id", "message"), [
    ("", "non-empty string"),
    ("x" * (MAX_ID_BYTES + 1), "longer than"),
    ("é" * (MAX_ID_BYTES // 2 + 1), "longer than"),
    (7, "non-empty string"),
])
def test_validate_all_checks_every_id_of_a_run_of_one_kind(id: object, message: str) -> None:
    subs = ("nic",)  # one tuple shared by the run: its kind is checked once, each id every time
    changes = [Change.put("vm", f"ok-{n}", subs, {}) for n in range(3)]
    bad = Change.put("vm", id, subs, {})  # type: ignore[arg-type]
    validator = Validator(RESOURCES)
    validator.validate_all(changes)
    with pytest.raises(ChangeError, match=message):
        validator.validate_all([*changes, bad, *changes])


def test_validate_all_checks_each_kind_as_validate_does() -> None:
    validator = Validator(RESOURCES)
    nic = ("nic",)
    with pytest.raises(ChangeError, match="unknown sub-resource"):
        validator.validate_all([Change.put("vm", "a", nic, {}),
                                Change.put("vm", "b", ("cpu",), {})])
    with pytest.raises(ChangeError, match="unknown resource 'disk'"):
        validator.validate_all([Change.put("vm", "a", nic, {}), Change.put("disk", "b", nic, {})])
    # Sub-resources in a list are checked on every change: a list can change after its check.
    subs = ["nic"]
    first = Change("vm", "a", subs, "put", {})  # type: ignore[arg-type]
    validator.validate_all([first])
    subs.append("cpu")
    with pytest.raises(ChangeError, match="unknown sub-resource"):
        validator.validate_all([first, Change("vm", "b", subs, "put", {})])  # type: ignore[arg-type]
    validator.validate_all([Change.put("vm", "c", nic, {}), Change.publish("vm", "d", nic)])
