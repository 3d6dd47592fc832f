"""A transport that only counts what it is written: what the in-process fan-out measurements
(bench/trace_cost.py, bench/studies/sse_vs_ws.py) give each subscriber instead of a socket."""

from __future__ import annotations


class CountingTransport:
    """Never full, never closing; `written` is the bytes it was given."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


__all__ = ["CountingTransport"]
