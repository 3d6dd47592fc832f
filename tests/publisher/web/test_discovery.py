"""GET /changefeeds in the shapes of Joyent's publishers, chosen by Accept-Version
(publisher.web.discovery): ours by default and for `~1`/`~2`, node-sdc-changefeed 1.4's bare
array and 1.5's object keyed by resource name for the package versions that served them."""

from __future__ import annotations

import aiohttp
import pytest

from publisher.server.service import Service
from publisher.web.discovery import VersionRefused, shape_for

VM = {"resource": "vm", "subResources": ["nic", "alias", "state"], "bootstrapRoute": "/vms"}
NETWORK = {"resource": "network", "subResources": ["ips", "name"], "bootstrapRoute": "/networks"}


@pytest.mark.parametrize(("header", "shape"), [
    (None, "resources"), ("", "resources"), ("*", "resources"), ("~1", "resources"),
    ("1", "resources"), ("1.x", "resources"), ("^1", "resources"), ("~2", "resources"),
    ("2.x", "resources"), ("~2.0", "resources"),
    ("~1.4", "array"), ("1.4", "array"), ("1.4.x", "array"), ("=1.2", "array"),
    ("~1.0", "array"), ("<1.5", "array"), ("<=1.4", "array"), ("v1.3.0", "array"),
    ("~1.5", "keyed"), ("1.5", "keyed"), ("1.5.4", "keyed"), ("^1.4", "keyed"), ("<=1.9", "keyed"),
])
def test_the_shape_of_each_accept_version(header: str | None, shape: str) -> None:
    assert shape_for(header) == shape


@pytest.mark.parametrize("header", ["~3", "~1.6", "<1.0", "^1.6", "banana", "~0", "<1", "1.4.2.1"])
def test_an_accept_version_no_shape_satisfies_is_refused(header: str) -> None:
    with pytest.raises(VersionRefused, match="unsupported Accept-Version"):
        shape_for(header)


async def get(service: Service, header: str | None) -> tuple[int, object]:
    headers = {} if header is None else {"Accept-Version": header}
    async with aiohttp.ClientSession() as http, http.get(
        service.url + "/changefeeds", headers=headers
    ) as response:
        return response.status, await response.json()


async def test_a_real_publisher_serves_each_shape(publisher: Service) -> None:
    assert await get(publisher, None) == (
        200, {"resources": [VM, NETWORK], "partitions": 1})
    assert await get(publisher, "~1") == (200, {"resources": [VM, NETWORK], "partitions": 1})
    assert await get(publisher, "~1.4") == (200, [VM, NETWORK])
    assert await get(publisher, "~1.5") == (200, {"vm": VM, "network": NETWORK})
    status, body = await get(publisher, "~1.6")
    assert status == 400 and isinstance(body, dict) and body["code"] == "BadAcceptVersion"
