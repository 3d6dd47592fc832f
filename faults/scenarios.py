"""The fault matrix: every scenario by name, in the order docs/reliability.md lists them.

A scenario is `async (size, directory) -> Row`: it starts its own servers under `directory`,
injects its fault, and returns the oracle's verdict (faults/oracle.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from faults.harness import Row, Size
from faults.herd import herd_of_resumes
from faults.network_faults import proxy_blackhole, proxy_cut, proxy_drip
from faults.outbox_faults import (
    outbox_listen_cut,
    outbox_postgres_kill,
    outbox_redis_empty,
    outbox_redis_kill_aof,
    outbox_relay_kill,
)
from faults.publisher_faults import (
    publisher_kill_one_url,
    publisher_kill_two_urls,
    tail_behind_trim_one,
    tail_behind_trim_two,
)
from faults.redis_faults import (
    commit_reply_lost,
    redis_kill_aof,
    redis_kill_no_persistence,
    redis_rollback,
    redis_sigstop,
)
from faults.sentinel_faults import (
    redis_sentinel_failover,
    redis_sentinel_failover_lagging,
)

Scenario = Callable[[Size, Path], Awaitable[Row]]

SCENARIOS: dict[str, Scenario] = {
    "redis_sigstop": redis_sigstop,
    "redis_kill_no_persistence": redis_kill_no_persistence,
    "redis_kill_aof": redis_kill_aof,
    "redis_rollback": redis_rollback,
    "commit_reply_lost": commit_reply_lost,
    "redis_sentinel_failover": redis_sentinel_failover,
    "redis_sentinel_failover_lagging": redis_sentinel_failover_lagging,
    "publisher_kill_one_url": publisher_kill_one_url,
    "publisher_kill_two_urls": publisher_kill_two_urls,
    "tail_behind_trim_one": tail_behind_trim_one,
    "tail_behind_trim_two": tail_behind_trim_two,
    "proxy_blackhole": proxy_blackhole,
    "proxy_drip": proxy_drip,
    "proxy_cut": proxy_cut,
    "herd_of_resumes": herd_of_resumes,
    "outbox_relay_kill": outbox_relay_kill,
    "outbox_postgres_kill": outbox_postgres_kill,
    "outbox_redis_kill_aof": outbox_redis_kill_aof,
    "outbox_redis_empty": outbox_redis_empty,
    "outbox_listen_cut": outbox_listen_cut,
}

ANNOUNCED: frozenset[str] = frozenset({
    "redis_kill_no_persistence",
    "redis_rollback",
    "redis_sentinel_failover_lagging",
    "outbox_redis_empty",
})
"""The scenarios whose fault destroys acknowledged history (Redis restarted empty, restored from
an older snapshot, a lagging replica promoted): every listener must be told to bootstrap again
(a `Resync`), whatever else it received."""
