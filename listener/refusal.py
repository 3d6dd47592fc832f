"""What a pull route's HTTP answer other than success means, for the pull and durable consumers."""

from __future__ import annotations

import orjson

from changefeed.errors import AccessDenied, ChangefeedError, PullFailed, PullRejected

RETRIED_4XX = frozenset({408, 429})
"""Client errors that say "not now" rather than "never": retried like a 5xx."""


def refusal(url: str, status: int, body: bytes) -> ChangefeedError:
    """What an answer of a pull route other than success means: 401 and 403 AccessDenied, another
    4xx PullRejected (not retried; its JSON error's code and message), anything else (a 5xx, 408,
    429) PullFailed (retried)."""
    if 400 <= status < 500 and status not in RETRIED_4XX:
        try:
            error = orjson.loads(body)
            code, message = str(error["code"]), str(error["message"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            code, message = "", body[:200].decode(errors="replace")
        if status in (401, 403):
            return AccessDenied(url, status, code, message)
        return PullRejected(url, status, code, message)
    return PullFailed(url, f"HTTP {status}: {body[:200]!r}", status)
