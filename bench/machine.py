"""What the figures were measured on: cores, memory, CPU, Python, Redis, library versions."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

LIBRARIES = ("aiohttp", "websockets", "redis", "hiredis", "orjson", "pyspark", "nats-py",
             "uvloop")


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def describe() -> dict[str, Any]:
    redis = shutil.which("redis-server")
    nats = shutil.which("nats-server")
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "redis": _first_line([redis, "--version"]) if redis else "absent",
        "nats_server": _first_line([nats, "--version"]) if nats else "absent",
        "libraries": {name: _version(name) for name in LIBRARIES},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
