"""GET /changefeeds in the shapes of Joyent's publishers, chosen by Accept-Version
(publisher.web.discovery): ours by default and for `~1`/`~2`, node-sdc-changefeed 1.4's bare
array and 1.5's object keyed by resource name for the package versions that served them."""

from __future__ import annotations

import dataclasses

import aiohttp
import pytest

from changefeed.errors import ConfigError
from publisher.config.settings import Config, Discovery, parse_config
from publisher.server.service import Service
from publisher.web.discovery import VersionRefused, shape_for
from tests.conftest import PublisherFactory

RESOURCES = (
    "module.exports = { resources: [{resource: 'vm', subResources: ['nic'], "
    "bootstrapRoute: '/vms'}],"
)

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


@pytest.mark.parametrize(("version", "bare"), [
    ("1.4", [VM, NETWORK]), ("1.0", [VM, NETWORK]), ("1.5", {"vm": VM, "network": NETWORK}),
    (None, {"resources": [VM, NETWORK], "partitions": 1}),
])
async def test_discovery_default_version_shapes_a_request_without_accept_version(
    config: Config, start_publisher: PublisherFactory, version: str | None, bare: object
) -> None:
    """Joyent's own publisher tests send no Accept-Version and read its shape; what asks for a
    shape still gets it, and the listeners' ranges still get RFD 5's."""
    configured = dataclasses.replace(config, discovery=Discovery(default_version=version))
    async with start_publisher(configured) as service:
        assert await get(service, None) == (200, bare)
        assert await get(service, "") == (200, bare)
        assert await get(service, "~1") == (200, {"resources": [VM, NETWORK], "partitions": 1})
        assert await get(service, "~2") == (200, {"resources": [VM, NETWORK], "partitions": 1})
        assert await get(service, "~1.4") == (200, [VM, NETWORK])
        assert await get(service, "~1.5") == (200, {"vm": VM, "network": NETWORK})


@pytest.mark.parametrize(("text", "version"), [
    ('"1.4"', "1.4"), ('"1.4.2"', "1.4"), ('"1.5.4"', "1.5"), ('"1.0"', "1.0"), ("null", None),
])
def test_discovery_default_version_in_config_js(text: str, version: str | None) -> None:
    config = parse_config(f"{RESOURCES} discovery: {{defaultVersion: {text}}} }};")
    assert config.discovery.default_version == version
    assert shape_for(None, version) in ("array", "keyed", "resources")


@pytest.mark.parametrize(
    "text", ['"1.6"', '"2.0"', '"~1.4"', '"1"', "1.4", "true", '""', '"1.4.x"']
)
def test_a_bad_discovery_default_version_names_the_key_and_what_was_expected(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"{RESOURCES} discovery: {{defaultVersion: {text}}} }};")
    assert caught.value.key == "discovery.defaultVersion"
    assert 'a node-sdc-changefeed version from "1.0" to "1.5"' in str(caught.value)


def test_the_discovery_section_has_no_other_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"{RESOURCES} discovery: {{version: \"1.4\"}} }};")
    assert caught.value.key.startswith("discovery.")
