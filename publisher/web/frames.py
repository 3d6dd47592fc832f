"""The one check of client frames that aiohttp does not make: every frame a client sends must be
masked (RFC 6455 5.1: "a server MUST close the connection upon receiving a frame that is not
masked"). aiohttp's websocket reader serves both sides and unmasks whatever it gets.

`ClientFrames` follows a client's byte stream by the frame headers alone (it never copies a
payload) and says when a frame arrives unmasked. Pure code: `publisher.web.admission` feeds it the
bytes of upgraded connections before aiohttp sees them.
"""

from __future__ import annotations

_MASK = 0x80
_LENGTH = 0x7F
_MAX_HEADER = 14
"""2 bytes, 8 of extended length, 4 of mask."""


class ClientFrames:
    """Feed it what a client sends after the upgrade; `feed` is False once a frame is unmasked."""

    __slots__ = ("_header", "_skip")

    def __init__(self) -> None:
        self._header = b""
        """The start of a header that has not fully arrived yet."""
        self._skip = 0
        """Payload bytes of the current frame still to come."""

    def feed(self, data: bytes) -> bool:
        pos, end = 0, len(data)
        while pos < end:
            if self._skip:
                step = min(self._skip, end - pos)
                self._skip -= step
                pos += step
                continue
            have = len(self._header)
            header = self._header + data[pos : pos + _MAX_HEADER - have]
            if len(header) < 2:
                self._header = header
                return True
            if not header[1] & _MASK:
                return False
            length = header[1] & _LENGTH
            extra = 2 if length == 126 else 8 if length == 127 else 0
            size = 2 + extra + 4
            if len(header) < size:
                self._header = header
                return True
            if extra:
                length = int.from_bytes(header[2 : 2 + extra], "big")
            pos += size - have
            self._header = b""
            self._skip = length
        return True


__all__ = ["ClientFrames"]
