"""A network namespace joined to the host by two veth pairs, for a real network partition.

A process started inside it (`prefix`, `ip netns exec`) reaches the host's services over one pair
(`service_host`, the pair `cut` takes down) and is reached, and reaches everything else, over the
other (`side_host` on the host's end, `inside_host` on the namespace's). Taking the service pair's
host end down is a partition the kernel makes: the process's established connections stall (their
bytes are dropped, no reset comes: they time out), and its new ones time out too, or fail with
"No route to host" once the neighbour entry is gone, as from a router; `mend` brings it back up
(new connections carry again a moment later). The namespace's own loopback is its own, so what it
must reach listens on the host ends' addresses (or on all addresses).

Needs root and iproute2 (`ip`): `Namespace.available()` says whether this process can. Every
name and address derives from a number (default: the process id), so concurrent runs do not meet.

    with Namespace() as ns:
        process = subprocess.Popen([*ns.prefix, sys.executable, ...])
        ns.cut(); ...; ns.mend()
"""

from __future__ import annotations

import os
import shutil
import subprocess
from types import TracebackType


class Namespace:
    """`ip netns` NAME with a service pair (10.A.B.0/30) and a side pair (10.A.B.4/30)."""

    def __init__(self, number: int | None = None) -> None:
        number = os.getpid() if number is None else number
        self.name = f"cfnem{number}"
        a, b = (number >> 8) & 255, number & 255
        self.service_host = f"10.{a}.{b}.1"
        """The host's end of the pair `cut` takes down: what the namespace reaches services by."""
        self._service_inside = f"10.{a}.{b}.2"
        self.side_host = f"10.{a}.{b}.5"
        """The host's end of the other pair (never cut)."""
        self.inside_host = f"10.{a}.{b}.6"
        """The namespace's end of the other pair: where the host reaches what runs inside."""
        self._service_link = f"cfs{number}"[:15]
        self._side_link = f"cfo{number}"[:15]
        self.created = False

    @staticmethod
    def available() -> bool:
        """Whether this process may make namespaces: root, and `ip` on PATH."""
        return os.geteuid() == 0 and shutil.which("ip") is not None

    @property
    def prefix(self) -> list[str]:
        """The argv prefix that runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def create(self) -> Namespace:
        self.close()  # a namespace left by a run that was killed
        _ip("netns", "add", self.name)
        self.created = True
        inside = ["ip", "netns", "exec", self.name, "ip"]
        _ip("link", "set", "lo", "up", argv=inside)
        for link, host, peer in ((self._service_link, self.service_host, self._service_inside),
                                 (self._side_link, self.side_host, self.inside_host)):
            peer_link = link.upper()
            _ip("link", "add", link, "type", "veth", "peer", "name", peer_link)
            _ip("link", "set", peer_link, "netns", self.name)
            _ip("addr", "add", f"{host}/30", "dev", link)
            _ip("link", "set", link, "up")
            _ip("addr", "add", f"{peer}/30", "dev", peer_link, argv=inside)
            _ip("link", "set", peer_link, "up", argv=inside)
        return self

    def cut(self) -> None:
        """Partition the namespace from the host's services (the service pair goes down)."""
        _ip("link", "set", self._service_link, "down")

    def mend(self) -> None:
        _ip("link", "set", self._service_link, "up")

    def close(self) -> None:
        """Delete the namespace (its ends of the pairs, and so the pairs, go with it)."""
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
        for link in (self._service_link, self._side_link):
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        self.created = False

    def __enter__(self) -> Namespace:
        return self.create()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def _ip(*args: str, argv: list[str] | None = None) -> None:
    """Run `ip ARGS` (or `argv` + ARGS); raise with ip's own message when it fails."""
    command = [*(argv or ["ip"]), *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


__all__ = ["Namespace"]
