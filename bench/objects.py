"""The stored objects of P3 and P4: a VM's state, about 150 bytes of JSON. Pure."""

from __future__ import annotations

from typing import Any


def object_id(number: int) -> str:
    return f"vm-{number:08d}"


def state(number: int) -> dict[str, Any]:
    return {
        "uuid": object_id(number),
        "alias": f"web-{number % 1000:03d}",
        "state": "running",
        "ram": 1024 * (1 + number % 8),
        "nics": [{"ip": f"10.0.{number % 250}.{number % 200}", "vlan": number % 4096}],
        "owner": "930896af-bf8c-48d4-885c-6573a94b1853",
    }
