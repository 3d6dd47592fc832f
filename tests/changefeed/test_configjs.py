"""The shared config.js validators: each returns the value or names the key, the value and what
was expected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from changefeed import configjs as cj
from changefeed.errors import ConfigError


@pytest.mark.parametrize(
    ("check", "value", "expected"),
    [
        (cj.string, "", "a non-empty string"),
        (cj.string, 3, "a non-empty string"),
        (cj.name, "bad name!", "a name of letters"),
        (cj.positive, 0, "a positive number"),
        (cj.positive, True, "a positive number"),
        (cj.positive_int, 1.5, "a positive integer"),
        (cj.port, 70000, "a port number"),
        (cj.redis_url, "http://x", "a redis://, rediss:// or unix:// URL"),
        (cj.redis_url, "unix://", "a unix:// URL with a socket path"),
        (cj.redis_url, "redis://:6379", "a redis:// URL with a host"),
        (cj.redis_url, "redis://h:99999", "a valid port"),
    ],
)
def test_a_bad_value_names_key_value_and_expectation(
    check: Callable[[str, Any], Any], value: Any, expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected) as caught:
        check("some.key", value)
    assert caught.value.key == "some.key" and caught.value.value == value


def test_good_values_come_back() -> None:
    assert cj.positive("k", 2) == 2.0 and isinstance(cj.positive("k", 2), float)
    assert cj.positive_int("k", 3) == 3
    assert cj.optional_positive("k", None) is None
    assert cj.redis_url("k", "unix:///tmp/r.sock") == "unix:///tmp/r.sock"
    assert cj.get({"a": 1}, "p.", "b", "default", cj.string) == "default"
    with pytest.raises(ConfigError) as caught:
        cj.get({"b": ""}, "p.", "b", "default", cj.string)
    assert caught.value.key == "p.b"


def test_a_section_must_be_an_object() -> None:
    with pytest.raises(ConfigError, match="an object") as caught:
        cj.section([], "limits")
    assert caught.value.key == "limits"


def test_unknown_keys_are_named_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="one of the known keys: a, b") as caught:
        cj.only({"a": 1, "c": 2}, "top.", {"a", "b"})
    assert caught.value.key == "top.c"


def test_object_literal_strips_module_exports_and_keeps_line_numbers() -> None:
    text = "// comment\n/* block */\nmodule.exports = {\n  a: 1,\n};\n"
    body = cj.object_literal(text)
    assert body.endswith("}") and "module.exports" not in body
    assert body.count("\n") == text.rstrip().rstrip(";").count("\n")
    assert cj.object_literal("{a: 1}") == "{a: 1}"
