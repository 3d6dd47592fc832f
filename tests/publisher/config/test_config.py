"""config.js parsing: the JavaScript forms and one clear message per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from changefeed.errors import ConfigError
from publisher.config.settings import Trace, load_config, parse_config

VM = '{resource: "vm", subResources: ["nic", "alias"], bootstrapRoute: "/vms"}'


def test_the_sample_config_loads() -> None:
    config = load_config(Path(__file__).parents[3] / "config.js")
    assert [r.resource for r in config.resources] == ["vm", "network"]
    assert config.bucket.redis_url is None
    assert config.state_dir.is_absolute()


def test_javascript_forms() -> None:
    text = f"""
    /* a block comment */
    // a line comment
    module.exports = {{
        resources: [{VM},],   // trailing commas
        maxAge: 30,
        bucket: {{redisUrl: 'redis://127.0.0.1:6379/2', name: "vms"}},
        limits: {{window: 50}},
    }};
    """
    config = parse_config(text, base=Path("/srv"))
    assert config.max_age == 30 and config.bucket.name == "vms" and config.limits.window == 50
    assert config.state_dir == Path("/srv/.changefeed")
    assert config.trim_every == 3
    plain = parse_config("{resources: [" + VM + "]}")
    assert plain.server.port == 8080


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("{resources: [" + VM + "], colour: 1}", "colour", "one of the known keys"),
        ("{resources: [" + VM + "], maxAge: '1h'}", "maxAge", "a positive number"),
        ("{resources: [" + VM + "], maxAge: -1}", "maxAge", "a positive number"),
        ("{resources: [" + VM + ", " + VM + "]}", "resources[1].resource", "not already listed"),
        (
            "{resources: [" + VM + "], bucket: {redisUrl: 'http://x'}}",
            "bucket.redisUrl",
            "redis://",
        ),
        (
            "{resources: [" + VM + "], bucket: {redisUrl: 'redis://h:99999'}}",
            "bucket.redisUrl",
            "port",
        ),
        ("{resources: [" + VM + "], server: {port: 70000}}", "server.port", "port number"),
        ("{resources: [" + VM + "], limits: {window: 0}}", "limits.window", "positive integer"),
        ("{resources: [" + VM + "], limits: {pageSize: 5000}}", "limits.pageSize", "maxPageSize"),
        ("{resources: []}", "resources", "non-empty list"),
        ("{}", "resources", "a list of"),
        (
            "{resources: [{resource: 'vm', subResources: 'nic', bootstrapRoute: '/v'}]}",
            "resources[0].subResources",
            "non-empty list of names",
        ),
        (
            "{resources: [{resource: 'vm', subResources: ['nic'], bootstrapRoute: 'vms'}]}",
            "resources[0].bootstrapRoute",
            "absolute path",
        ),
        (
            "{resources: [{resource: 'vm', subResources: ['nic'],"
            " bootstrapRoute: '/changefeeds/x'}]}",
            "resources[0].bootstrapRoute",
            "outside /changefeeds",
        ),
        (
            "{resources: [{resource: 'vm', subResources: ['nic']}]}",
            "resources[0].bootstrapRoute",
            "present",
        ),
        ("{resources: [" + VM + "]", "config.js:1:87", "JavaScript object literal"),
        ("{resources: [" + VM + "], server: {maxConnections: 0}}", "server.maxConnections",
         "positive integer"),
        ("{resources: [" + VM + "], server: {maxConnections: 10, maxConnectionsPerClient: 11}}",
         "server.maxConnectionsPerClient", "at most server.maxConnections (10)"),
        ("{resources: [" + VM + "], server: {idleTimeout: 0}}", "server.idleTimeout",
         "positive number"),
        ("{resources: [" + VM + "], server: {bodyTimeout: 'x'}}", "server.bodyTimeout",
         "positive number"),
        ("{resources: [" + VM + "], server: {maxBodyBytes: 1.5}}", "server.maxBodyBytes",
         "positive integer"),
        ("{resources: [" + VM + "], bucket: {poolSize: 0}}", "bucket.poolSize", "positive integer"),
        ("{resources: [" + VM + "], bucket: {poolTimeout: -1}}", "bucket.poolTimeout",
         "positive number"),
        ("{resources: [" + VM + "], bucket: {pool: 1}}", "bucket.pool", "known keys"),
        ("{resources: [" + VM + "], feed: {consumers: ['a b']}}", "feed.consumers",
         "consumer names"),
        ("{resources: [" + VM + "], feed: {consumers: ['a', 'a']}}", "feed.consumers",
         "no duplicates"),
        ("{resources: [" + VM + "], feed: {consumers: 'a'}}", "feed.consumers", "a list"),
        ("{resources: [" + VM + "], feed: {maxCursorSets: 0}}", "feed.maxCursorSets",
         "positive integer"),
        ("{resources: [" + VM + "], feed: {cursorSetMaxAge: 0}}", "feed.cursorSetMaxAge",
         "positive number"),
        ("{resources: [" + VM + "], feed: {colour: 1}}", "feed.colour", "known keys"),
        ("{resources: [" + VM + "], trace: {items: -1}}", "trace.items",
         "an integer from 0 (no trace) to 100000"),
        ("{resources: [" + VM + "], trace: {items: 100001}}", "trace.items", "to 100000"),
        ("{resources: [" + VM + "], trace: {items: true}}", "trace.items", "got true, expected"),
        ("{resources: [" + VM + "], trace: {items: null}}", "trace.items", "got null, expected"),
        ("{resources: [" + VM + "], trace: {items: [false, {a: null}]}}", "trace.items",
         "got [false, {\"a\": null}], expected"),
        ("{resources: [" + VM + "], trace: {maxAge: -5}}", "trace.maxAge", "a positive number"),
        ("{resources: [" + VM + "], trace: {size: 1}}", "trace.size", "known keys"),
    ],
)
def test_invalid_config_names_key_value_and_expectation(text: str, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert info.value.key == key
    assert expected in str(info.value)
    where = key if key.startswith("config.js:") else f"config key {key!r}"
    assert str(info.value).startswith(where + ": got "), str(info.value)
    assert "True" not in str(info.value) and "None" not in str(info.value)  # JS spellings


def test_overrides_are_validated() -> None:
    config = parse_config("{resources: [" + VM + "]}")
    changed = config.with_overrides(host="0.0.0.0", port=0, redis_url="unix:///tmp/r.sock")
    assert (changed.server.host, changed.server.port) == ("0.0.0.0", 0)
    assert changed.bucket.redis_url == "unix:///tmp/r.sock"
    with pytest.raises(ConfigError, match="--redis-url"):
        config.with_overrides(redis_url="mysql://x")


def test_the_new_sections_and_their_defaults() -> None:
    config = parse_config("{resources: [" + VM + "]}")
    assert config.feed.consumers == frozenset() and config.feed.max_cursor_sets == 16
    assert (config.bucket.pool_size, config.bucket.pool_timeout) == (64, 5.0)
    assert (config.server.max_connections, config.server.max_connections_per_client) == (
        10000, 1000)
    text = "{resources: [" + VM + """], feed: {consumers: ["billing", "audit"],
              cursorSetMaxAge: 60, maxCursorSets: 2}, bucket: {poolSize: 8, poolTimeout: 0.5},
              server: {maxConnections: 50, maxConnectionsPerClient: 5, idleTimeout: 3,
              bodyTimeout: 2, maxBodyBytes: 1024}}"""
    config = parse_config(text)
    assert config.feed.consumers == {"billing", "audit"} and config.feed.cursor_set_max_age == 60
    assert (config.bucket.pool_size, config.bucket.pool_timeout) == (8, 0.5)
    assert config.server.max_connections_per_client == 5 and config.server.idle_timeout == 3


def test_the_trace_section() -> None:
    assert parse_config("{resources: [" + VM + "]}").trace == Trace(10000, 600.0)
    config = parse_config("{resources: [" + VM + "], trace: {items: 0, maxAge: 0}}")
    assert config.trace == Trace(0, None) and not config.trace.enabled
    config = parse_config("{resources: [" + VM + "], trace: {items: 5, maxAge: null}}")
    assert config.trace == Trace(5, None) and config.trace.enabled


def test_a_redis_password_is_never_shown() -> None:
    text = "{resources: [" + VM + "], bucket: {redisUrl: 'redis://u:hunter2@h:99999/0'}}"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert "hunter2" not in str(info.value) and "u:***@h" in str(info.value)
    config = parse_config("{resources: [" + VM + "]}")
    with pytest.raises(ConfigError) as info:
        config.with_overrides(redis_url="http://h/?password=hunter2")
    assert "hunter2" not in str(info.value) and "password=***" in str(info.value)
    shown = config.with_overrides(redis_url="redis://h:6379/0?password=hunter2&db=1")
    assert shown.bucket.display_url == "redis://h:6379/0?password=***&db=1"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / "absent.js")
    assert str(error.value) == (
        f"cannot read the config file {tmp_path / 'absent.js'}: No such file or directory")
    assert error.value.key == "<file>"


def test_bucket_sentinel_becomes_a_sentinel_url_and_excludes_redis_url() -> None:
    from publisher.config.settings import parse_config

    resources = '[{resource: "vm", subResources: ["nic"], bootstrapRoute: "/vms"}]'
    text = (
        "module.exports = {resources: " + resources + ", bucket: {sentinel: "
        '{master: "m", nodes: ["127.0.0.1:26379", "127.0.0.1:26380"]}}}'
    )
    config = parse_config(text)
    assert config.bucket.redis_url == "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/m/0"
    both = text.replace("bucket: {", 'bucket: {redisUrl: "redis://h:1/0", ')
    with pytest.raises(ConfigError) as raised:
        parse_config(both)
    assert raised.value.key == "bucket.sentinel"


def test_the_sample_errors_of_config_md_are_the_loaders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = (Path(__file__).parents[3] / "docs" / "config.md").read_text()
    start = doc.index("```\nError: config key 'maxAge'") + 4
    sample = doc[start : doc.index("```", start)].splitlines()
    vm = '{resource: "vm", subResources: ["nic"], bootstrapRoute: "/vms"}'
    texts = [
        f"{{resources: [{vm}], maxAge: -5}}",
        f"{{resources: [{vm}], maxAge: true}}",
        f"{{resources: [{vm}], colour: 1}}",
        f"{{resources: [{vm}, {vm}]}}",
        f"{{resources: [{vm}], bucket: {{redisUrl: 'http://x'}}}}",
        None,  # no file
        "module.exports = {\n  maxAge: 3600,\n  maxAge: 60,\n  resources: []};\n",
        "module.exports = {\n  maxAge: 3600,\n  resources: [,\n",
    ]
    monkeypatch.chdir(tmp_path)
    said = []
    for text in texts:
        if text is not None:
            Path("config.js").write_text(text)
        with pytest.raises(ConfigError) as error:
            load_config("config.js" if text is not None else "nope.js")
        said.append(f"Error: {error.value}")
    assert said == sample
