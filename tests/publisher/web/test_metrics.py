"""/metrics: Prometheus' text format, parsed with prometheus-client's own parser, after real
listeners, commits, refusals and requests."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from publisher.server.service import Service
from tests.servers import eventually, scaled
from tests.wsclient import refused, register, v1, v2

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(service: Service) -> tuple[Samples, dict[str, str], str]:
    """The samples by (name, labels), each family's type, and the Content-Type."""
    timeout = aiohttp.ClientTimeout(total=scaled(10))
    async with aiohttp.ClientSession(timeout=timeout) as http, http.get(
        service.url + "/metrics"
    ) as response:
        assert response.status == 200
        text, content_type = await response.text(), response.headers["Content-Type"]
    samples: Samples = {}
    types = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples, types, content_type


async def test_metrics_count_listeners_deliveries_refusals_and_requests(publisher: Any) -> None:
    service: Service = publisher
    one = await register(service.ws_url, v1("vm", ["nic"]))
    two = await register(service.ws_url, v2({"vm": ["nic"], "network": ["ips"]}), version="~2")
    code, _ = await refused(service.ws_url, '{"not": "a registration"}')
    assert code == 1008
    for i in range(3):
        await service.bucket.publish("vm", f"id{i}", ["nic"])
    await one.take(3)
    await two.take(3)
    async with aiohttp.ClientSession() as http:
        for path in ("/vms?limit=1", "/vms/nope", "/nowhere"):
            async with http.get(service.url + path) as response:
                await response.read()

    samples, types, content_type = await scrape(service)
    assert content_type.startswith("text/plain; version=")
    assert samples["changefeed_listeners", (("resource", "vm"), ("version", "1"))] == 1
    assert samples["changefeed_listeners", (("resource", "vm"), ("version", "2"))] == 1
    assert samples["changefeed_listeners", (("resource", "network"), ("version", "2"))] == 1
    assert types["changefeed_items_delivered"] == "counter"
    assert samples["changefeed_items_delivered_total", ()] == 6
    assert samples["changefeed_written_bytes_total", ()] > 6 * 50
    assert samples[
        "changefeed_registrations_refused_total", (("reason", "invalid_registration"),)
    ] == 1
    assert types["changefeed_commit_to_write_seconds"] == "histogram"
    assert samples["changefeed_commit_to_write_seconds_count", ()] == 3
    assert samples["changefeed_commit_to_write_seconds_bucket", (("le", "+Inf"),)] == 3
    requests = "changefeed_http_requests_total"
    assert samples[requests, (("method", "GET"), ("route", "/vms"), ("status", "200"))] == 1
    assert samples[requests, (("method", "GET"), ("route", "/vms/{id}"), ("status", "404"))] == 1
    assert samples[requests, (("method", "GET"), ("route", "unmatched"), ("status", "404"))] == 1
    # A websocket counts when it ends: the refused one has, the two registered have not.
    upgrades = (requests, (("method", "GET"), ("route", "/changefeeds"), ("status", "101")))
    assert samples[upgrades] == 1
    for name in ("changefeed_tail_lag_items", "changefeed_tail_lag_seconds",
                 "changefeed_long_polls_waiting", "changefeed_ready", "changefeed_draining",
                 "changefeed_asyncio_tasks"):
        assert types[name] == "gauge", name
    assert samples["changefeed_ready", ()] == 1
    # The tail, the websockets open, background work: some tasks, never none.
    assert samples["changefeed_asyncio_tasks", ()] >= 3
    assert samples["changefeed_tail_lag_items", ()] == 0
    assert samples["changefeed_slow_consumer_closes_total", ()] == 0
    assert samples["changefeed_resyncs_total", (("cause", "epoch_change"),)] == 0
    assert samples["changefeed_redis_errors_total", (("operation", "tail"),)] == 0
    assert samples["changefeed_items_trimmed_total", ()] == 0
    info = [labels for (name, labels) in samples if name == "changefeed_publisher_info"]
    assert dict(info[0])["publisher"] == service.id
    assert ("process_resident_memory_bytes", ()) in samples

    await one.close()
    await eventually(lambda: len(service.hub.connections) == 1, "the listener is gone")
    samples, _, _ = await scrape(service)
    assert ("changefeed_listeners", (("resource", "vm"), ("version", "1"))) not in samples
    await two.close()


async def test_each_service_has_its_own_registry(publisher: Any, make_config: Any) -> None:
    """Two services in one process (as in the tests): separate metrics, no duplicate names."""
    other = Service(publisher.config)
    try:
        assert other.metrics.registry is not publisher.metrics.registry
    finally:
        await other.bucket.aclose()
