"""Client-side framing for the load generators: websocket (RFC 6455) and NATS, no I/O.

The load generators read thousands of sockets in one process, so they do not use a websocket
library: they parse the server's frames here, returning offsets into the received bytes instead
of copies.
"""

from __future__ import annotations

import base64
import os

TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA


def upgrade_request(host: str, port: int, path: str, headers: dict[str, str]) -> bytes:
    """The HTTP request opening a websocket."""
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def upgrade_status(head: bytes) -> int:
    """The status code of an HTTP response head."""
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def client_frame(opcode: int, payload: bytes) -> bytes:
    """A final, masked frame from client to server."""
    length = len(payload)
    if length < 126:
        header = bytes([0x80 | opcode, 0x80 | length])
    elif length < 1 << 16:
        header = bytes([0x80 | opcode, 0x80 | 126]) + length.to_bytes(2, "big")
    else:
        header = bytes([0x80 | opcode, 0x80 | 127]) + length.to_bytes(8, "big")
    mask = os.urandom(4)
    repeated = (mask * (length // 4 + 1))[:length]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(
        length, "big"
    )
    return header + mask + masked


def ws_frames(data: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """The complete server frames in `data`, as (opcode, payload start, payload end), and the
    offset where an incomplete frame starts (len(data) when there is none)."""
    frames = []
    i, n = 0, len(data)
    while n - i >= 2:
        length = data[i + 1] & 0x7F
        if length < 126:
            start = i + 2
        elif length == 126:
            if n - i < 4:
                break
            length = (data[i + 2] << 8) | data[i + 3]
            start = i + 4
        else:
            if n - i < 10:
                break
            length = int.from_bytes(data[i + 2 : i + 10], "big")
            start = i + 10
        end = start + length
        if end > n:
            break
        frames.append((data[i] & 0x0F, start, end))
        i = end
    return frames, i


def close_code(data: bytes, start: int, end: int) -> int:
    """The code of a close frame's payload (1005 when it has none)."""
    return int.from_bytes(data[start : start + 2], "big") if end - start >= 2 else 1005


NATS_MSG, NATS_PING, NATS_OTHER = 0, 1, 2


def nats_connect(subject: str) -> bytes:
    """CONNECT, SUB (sid 1) and a PING whose PONG says the subscription is in place."""
    return (
        b'CONNECT {"verbose":false,"pedantic":false,"name":"bench","protocol":1}\r\n'
        + f"SUB {subject} 1\r\n".encode()
        + b"PING\r\n"
    )


def nats_messages(data: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """The complete NATS protocol messages in `data` as (kind, payload start, payload end), and
    the offset where an incomplete one starts."""
    out = []
    i, n = 0, len(data)
    while True:
        eol = data.find(b"\r\n", i)
        if eol < 0:
            break
        if data.startswith(b"MSG ", i):
            size = int(data[data.rfind(b" ", i, eol) + 1 : eol])
            start = eol + 2
            end = start + size
            if end + 2 > n:
                break
            out.append((NATS_MSG, start, end))
            i = end + 2
        else:
            out.append((NATS_PING if data.startswith(b"PING", i) else NATS_OTHER, i, eol))
            i = eol + 2
    return out, i
