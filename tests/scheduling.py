"""pytest-xdist's scheduling of the suite: xdist's load scheduling, with groups of tests that
share one worker (tests/conftest.py SHARED_WORKERS).

xdist's own `--dist loadgroup` reads `xdist_group` marks from node ids that the workers rename,
which pytest 9.2 no longer lets them do (every group is then ignored); the groups here are named
by node-id prefix, which the controller sees as collected.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling


class SharedWorkers(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no type hints
    """A test's scope is its group (the first of `groups` whose prefix its node id has), else
    the test itself: a group goes to one worker whole, the rest one test at a time."""

    def __init__(self, config: pytest.Config, log: Any, groups: dict[str, str]) -> None:
        super().__init__(config, log)
        self.groups = groups

    def _split_scope(self, nodeid: str) -> str:
        for prefix, group in self.groups.items():
            if nodeid.startswith(prefix):
                return f"group:{group}"
        return nodeid
