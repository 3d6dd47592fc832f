"""`redis+sentinel://` URLs and config.js's `bucket.sentinel`: parsed without I/O."""

from __future__ import annotations

import pytest

from changefeed.configjs import masked_url
from changefeed.errors import ConfigError
from publisher.bucket.redis.sentinel import (
    SentinelUrl,
    parse_sentinel_url,
    redis_url,
    sentinel_section,
)


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_passwords() -> None:
    parts = parse_sentinel_url(
        "k", "redis+sentinel://:s%40cret@10.0.0.1:26379,[::1]:26380/mymaster/2"
        "?sentinelPassword=other"
    )
    assert parts == SentinelUrl(
        (("10.0.0.1", 26379), ("::1", 26380)), "mymaster", 2, None, "s@cret", "other"
    )
    assert parse_sentinel_url("k", parts.to_url()) == parts
    assert parse_sentinel_url("k", "redis+sentinel://h:1/m").db == 0


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel:///mymaster",
        "redis+sentinel://h:1",
        "redis+sentinel://h/mymaster",
        "redis+sentinel://h:1/m/x",
        "redis+sentinel://h:1/m/0?db=1",
    ],
)
def test_a_malformed_sentinel_url_names_the_key(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        redis_url("bucket.redisUrl", url)
    assert raised.value.key == "bucket.redisUrl"


def test_passwords_are_masked() -> None:
    shown = masked_url("redis+sentinel://:pw@h:1,h:2/m/0?sentinelPassword=spw")
    assert "pw" not in shown.replace("sentinelPassword", "")


def test_the_sentinel_section_is_a_url_and_its_errors_name_the_key() -> None:
    url = sentinel_section(
        "bucket.sentinel", {"master": "m", "nodes": ["h:1", "h:2"], "password": "p"}
    )
    assert parse_sentinel_url("k", url) == SentinelUrl((("h", 1), ("h", 2)), "m", 0, None, "p")
    for bad, key in [
        ({"nodes": ["h:1"]}, "bucket.sentinel.master"),
        ({"master": "m", "nodes": []}, "bucket.sentinel.nodes"),
        ({"master": "m", "nodes": ["h"]}, "bucket.sentinel.nodes"),
        ({"master": "m", "nodes": ["h:1"], "port": 1}, "bucket.sentinel.port"),
    ]:
        with pytest.raises(ConfigError) as raised:
            sentinel_section("bucket.sentinel", bad)
        assert raised.value.key == key
