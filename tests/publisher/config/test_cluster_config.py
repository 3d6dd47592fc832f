"""config.js's `bucket.cluster` and `redis+cluster://` URLs: what they mean, and errors that
name the key and never show a password."""

from __future__ import annotations

import pytest

from changefeed.errors import ConfigError
from publisher.bucket.redis.cluster_url import parse_cluster_url
from publisher.bucket.redis.sentinel import redis_url
from publisher.config.settings import parse_config

RESOURCES = '[{resource: "vm", subResources: ["nic"], bootstrapRoute: "/vms"}]'


def config_text(bucket: str) -> str:
    return "module.exports = {resources: " + RESOURCES + ", bucket: {" + bucket + "}}"


def test_bucket_cluster_becomes_a_cluster_url() -> None:
    config = parse_config(config_text(
        'cluster: ["redis://:s3cret@10.0.0.1:7000", "redis://10.0.0.2:7001/0"], partitions: 8'
    ))
    assert config.bucket.redis_url == "redis+cluster://:s3cret@10.0.0.1:7000,10.0.0.2:7001/"
    assert config.bucket.partitions == 8
    assert "s3cret" not in (config.bucket.display_url or "")
    parts = parse_cluster_url("k", config.bucket.redis_url)
    assert parts.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 7001)) and parts.password == "s3cret"


@pytest.mark.parametrize(
    ("bucket", "key", "expected"),
    [
        ("cluster: []", "bucket.cluster", "non-empty list"),
        ('cluster: "redis://h:1"', "bucket.cluster", "non-empty list"),
        ("cluster: [7000]", "bucket.cluster[0]", "node URL"),
        ('cluster: ["rediss://h:7000"]', "bucket.cluster[0]", "node URL"),
        ('cluster: ["redis://h"]', "bucket.cluster[0]", "node URL"),
        ('cluster: ["redis://h:99999"]', "bucket.cluster[0]", "valid port"),
        ('cluster: ["redis://h:7000/3"]', "bucket.cluster[0]", "no database but 0"),
        ('cluster: ["redis://:a@h:1", "redis://:b@h:2"]', "bucket.cluster[1]", "same password"),
        ('cluster: ["redis://h:1"], redisUrl: "redis://h:1/0"', "bucket.cluster", "redisUrl"),
        ('cluster: ["redis://h:1"], sentinel: {master: "m", nodes: ["h:2"]}', "bucket.cluster",
         "sentinel"),
        ('redisUrl: "redis+cluster://:pw@h/"', "bucket.redisUrl", "host:port"),
        ('redisUrl: "redis+cluster://:pw@h:1/2"', "bucket.redisUrl", "no database"),
        ('redisUrl: "redis+cluster://:pw@/"', "bucket.redisUrl", "at least one node"),
    ],
)
def test_cluster_errors_name_the_key_and_hide_passwords(
    bucket: str, key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(config_text(bucket))
    assert raised.value.key == key
    assert expected in str(raised.value)
    assert "pw" not in str(raised.value) and ":a@" not in str(raised.value)


def test_a_cluster_url_is_a_redis_url_wherever_one_is_taken() -> None:
    url = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/"
    assert redis_url("--redis-url", url) == url
    config = parse_config(config_text(f'redisUrl: "{url}"'))
    assert config.bucket.redis_url == url
