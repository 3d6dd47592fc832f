"""The listener's settings from config.js: one pure function, errors naming key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from changefeed.backoff import Backoff
from changefeed.errors import ConfigError
from listener.config import (
    BufferConfig,
    ListenerConfig,
    load_listener_config,
    parse_listener_config,
)


def test_defaults() -> None:
    assert parse_listener_config("{}") == ListenerConfig()
    assert ListenerConfig().buffer == BufferConfig("memory", 10000)


def test_every_key(tmp_path: Path) -> None:
    path = tmp_path / "config.js"
    path.write_text("""
        // the service's own config.js
        module.exports = {
            vmapi: {url: "http://vmapi"},
            changefeed: {
                buffer: {kind: "redis", size: 50, redisUrl: "redis://localhost:6379/0",
                         key: "tcns.buffer"},
                backoff: {initial: 0.2, maximum: 5, factor: 3, jitter: 0, retries: 7},
                healthyAfter: 60, pageSize: 500, heartbeatInterval: null,
                pingInterval: 5, pingTimeout: 2, openTimeout: 3, httpTimeout: 4,
            },
        };
    """)
    assert load_listener_config(path, section="changefeed") == ListenerConfig(
        buffer=BufferConfig("redis", 50, "redis://localhost:6379/0", "tcns.buffer"),
        backoff=Backoff(0.2, 5, 3, 0.0, 7),
        healthy_after=60, page_size=500, heartbeat_interval=None,
        ping_interval=5, ping_timeout=2, open_timeout=3, http_timeout=4,
    )


def test_a_missing_section_means_defaults() -> None:
    assert parse_listener_config("{other: 1}", section="changefeed") == ListenerConfig()


@pytest.mark.parametrize(("text", "key", "expected"), [
    ("{bufer: {}}", "bufer", "one of the known keys"),
    ("{buffer: {size: 0}}", "buffer.size", "a positive integer"),
    ("{buffer: {kind: 'disk'}}", "buffer.kind", '"memory" or "redis"'),
    ("{buffer: {kind: 'redis'}}", "buffer.redisUrl", "a Redis URL"),
    ("{buffer: {redisUrl: 'http://x'}}", "buffer.redisUrl", "redis://"),
    ("{backoff: {initial: 5, maximum: 1}}", "backoff.maximum", "at least"),
    ("{backoff: {jitter: 2}}", "backoff.jitter", "from 0 to 1"),
    ("{backoff: {factor: 0.5}}", "backoff.factor", ">= 1"),
    ("{backoff: {retries: -1}}", "backoff.retries", ">= 0"),
    ("{pingInterval: 'soon'}", "pingInterval", "a positive number"),
    ("{changefeed: {pageSize: 1.5}}", "changefeed.pageSize", "a positive integer"),
    ("[]", "<top level>", "an object"),
])
def test_errors_name_key_value_and_expectation(text: str, key: str, expected: str) -> None:
    section = "changefeed" if "changefeed" in text else None
    with pytest.raises(ConfigError) as caught:
        parse_listener_config(text, section=section)
    assert caught.value.key == key
    assert expected in caught.value.expected


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="readable"):
        load_listener_config(tmp_path / "absent.js")
