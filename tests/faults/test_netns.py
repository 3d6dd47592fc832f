"""The nemesis's network partition (changefeed_testing/netns.py): a process in a namespace loses
Redis when the veth pair it reaches it by goes down, the way a network partition loses it (its
established connection stalls, no reset; a new one times out or finds no route), and has it
again when the pair comes back up. CI runs as root; elsewhere the nemesis falls back to its
proxy's blackhole."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from changefeed_testing.netns import Namespace
from changefeed_testing.proxy import Proxy
from faults.nemesis.system import System
from tests.servers import RedisServer

CLIENT = r"""
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])

def ping(sock):
    sock.sendall(b"PING\r\n")
    return sock.recv(64).decode().strip()

held = socket.create_connection((host, port), timeout=2)
print("before", ping(held), flush=True)
sys.stdin.readline()  # cut
held.settimeout(0.5)
try:
    print("held", ping(held), flush=True)
except OSError as error:
    print("held", type(error).__name__, flush=True)
try:
    socket.create_connection((host, port), timeout=2)
    print("new connected", flush=True)
except OSError as error:
    print("new", "no route" if error.errno == 113 else type(error).__name__, flush=True)
sys.stdin.readline()  # mended
for attempt in range(50):  # the link takes a moment to carry again
    try:
        print("after", ping(socket.create_connection((host, port), timeout=2)), flush=True)
        break
    except OSError:
        time.sleep(0.1)
"""


async def test_a_cut_namespace_loses_redis_until_mended(tcp_redis_server: RedisServer) -> None:
    assert Namespace.available(), "needs root and iproute2 (CI runs as root)"
    with Namespace() as ns:
        async with Proxy("127.0.0.1", tcp_redis_server.port, listen=ns.service_host) as proxy:
            client = await asyncio.create_subprocess_exec(
                *ns.prefix, sys.executable, "-c", CLIENT, ns.service_host, str(proxy.port),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            assert client.stdin is not None and client.stdout is not None

            async def line() -> str:
                assert client.stdout is not None
                return (await asyncio.wait_for(client.stdout.readline(), 10)).decode().strip()

            assert await line() == "before +PONG"
            ns.cut()
            client.stdin.write(b"cut\n")
            assert await line() == "held TimeoutError", "no reset: the bytes are dropped"
            # Dropped too while the neighbour entry lasts; then "No route to host" at once.
            assert await line() in ("new TimeoutError", "new no route")
            ns.mend()
            client.stdin.write(b"mended\n")
            assert await line() == "after +PONG"
            assert await client.wait() == 0


def test_the_nemesis_puts_publisher_2_in_a_namespace_where_it_can(tmp_path: Path) -> None:
    system = System(tmp_path)
    assert (system.namespace is not None) == Namespace.available()
