"""Each test of a bucket in the session's Redis Cluster (tests/conftest.py) uses a bucket name of
its own."""

from __future__ import annotations

import itertools

import pytest

_names = itertools.count()


@pytest.fixture
def bucket_name() -> str:
    """A bucket name no other test of the session uses."""
    return f"cf{next(_names)}"
