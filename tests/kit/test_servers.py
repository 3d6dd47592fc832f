"""changefeed_testing/servers.py's share of ports per pytest-xdist worker: two workers never pick
the same free port, and a cluster node's bus port belongs to the node's worker."""

from __future__ import annotations

import pytest

from changefeed_testing.servers import cluster_port, free_port, port_owner, xdist_worker


def test_outside_xdist_one_worker_owns_every_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert xdist_worker() == (0, 1)
    assert {port_owner(port, 1) for port in range(1024, 65536)} == {0}


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_workers_share_the_ports_and_a_bus_port_goes_with_its_node(workers: int) -> None:
    owners = [port_owner(port, workers) for port in range(32768, 61000)]
    for worker in range(workers):  # every worker a fair share, odd ports (bind's) as even ones
        assert owners.count(worker) > 0.8 * len(owners) / workers
        assert owners[1::2].count(worker) > 0.8 * len(owners[1::2]) / workers
    assert all(port_owner(p, workers) == port_owner(p + 10000, workers) for p in range(1024, 55536))


@pytest.mark.parametrize("worker", [0, 1])
def test_a_worker_picks_only_ports_of_its_share(
    worker: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    assert xdist_worker() == (worker, 2)
    for _ in range(20):
        assert port_owner(free_port(), 2) == worker
        assert port_owner(cluster_port() + 10000, 2) == worker
