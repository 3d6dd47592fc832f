"""Servers for the package's `node --test` suite: a private redis-server, `changefeed serve`
publishers, and commits to their bucket, driven by JSON lines on standard input.

Run by test/harness.mjs with the project's venv (`<repo>/.venv/bin/python`, or $CHANGEFEED_PYTHON).
It reuses changefeed_testing.servers, so the redis-server and the publishers start exactly as in
the Python suite: on free ports, ready when they say so, with their output kept. Every command is
one JSON object on a line, and gets one JSON line back: {"ok": ...} or {"error": "..."}.

    {"op": "publisher", "config": {...}, "fixedPort": true}  -> {"id", "url"}
    {"op": "kill" | "stop" | "start", "id"}                  -> {"url"}
    {"op": "output", "id"}                                    -> the publisher's output
    {"op": "commit", "changes": [[resource, id, subs, state or null, delete?], ...],
     "bucket": "cluster"?}                                    -> cursors (composite on "cluster")
    {"op": "cluster", "partitions": n}  -> {"id", "url"}: a publisher on a bucket of n partitions
                                           in a 3-master Redis Cluster (started on first use), by
                                           a redis+cluster:// URL
    {"op": "trim", "maxAge": seconds}                         -> items removed
    {"op": "flush"}                                           -> the bucket is gone (new epoch)
    {"op": "pki"}                                             -> {"ca", "cert", "key"}: PEM files

Standard input closing stops every server.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import orjson

from changefeed_testing.servers import (
    PublisherProcess,
    RedisCluster,
    RedisServer,
    free_port,
    write_config,
)
from publisher.bucket import Change, ChangeBucket, open_bucket
from publisher.config.settings import load_config


class Fixture:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.redis = RedisServer(directory / "redis", persist=False).start()
        self.publishers: dict[str, PublisherProcess] = {}
        self.config_path = write_config(directory / "base.js", self.redis.url)
        config = load_config(self.config_path)
        self.bucket = open_bucket(self.redis.url, config.bucket.name, config.resources)
        self.cluster: RedisCluster | None = None
        self.cluster_bucket: ChangeBucket | None = None

    async def start_cluster(self, partitions: int) -> dict[str, str]:
        """A publisher on a bucket of `partitions` partitions in a Redis Cluster (one cluster,
        one bucket: a second call gives another publisher on the same bucket)."""
        if self.cluster is None:
            self.cluster = await asyncio.to_thread(RedisCluster(self.directory / "cluster").start)
        bucket = {"redisUrl": self.cluster.url, "name": "cluster", "partitions": partitions}
        name = f"p{len(self.publishers) + 1}"
        path = write_config(self.directory / f"{name}.js", self.cluster.url, bucket=bucket)
        if self.cluster_bucket is None:
            self.cluster_bucket = open_bucket(load_config(path))
        process = PublisherProcess(path)
        await asyncio.to_thread(process.start)
        self.publishers[name] = process
        return {"id": name, "url": process.url}

    async def handle(self, command: dict[str, Any]) -> Any:
        op = command["op"]
        if op == "publisher":
            extra = dict(command.get("config") or {})
            if command.get("fixedPort"):
                extra.setdefault("server", {"host": "127.0.0.1", "port": free_port()})
            name = f"p{len(self.publishers) + 1}"
            path = write_config(self.directory / f"{name}.js", self.redis.url, **extra)
            process = PublisherProcess(path)
            await asyncio.to_thread(process.start)
            self.publishers[name] = process
            return {"id": name, "url": process.url}
        if op in ("kill", "stop", "start"):
            process = self.publishers[command["id"]]
            if op == "start":
                await asyncio.to_thread(process.start)
            else:
                await asyncio.to_thread(process.kill if op == "kill" else process.stop)
            return {"url": process.url}
        if op == "output":
            return self.publishers[command["id"]].output()
        if op == "cluster":
            return await self.start_cluster(int(command["partitions"]))
        if op == "commit":
            bucket = self.bucket
            if command.get("bucket") == "cluster":
                if self.cluster_bucket is None:
                    raise ValueError("no cluster bucket: start one with the cluster op first")
                bucket = self.cluster_bucket
            changes = []
            for resource, id, subs, state, *rest in command["changes"]:
                if rest and rest[0]:
                    changes.append(Change.delete(resource, id, subs))
                elif state is None:
                    changes.append(Change.publish(resource, id, subs))
                else:
                    changes.append(Change.put(resource, id, subs, state))
            return await bucket.commit_many(changes)
        if op == "trim":
            return await self.bucket.log.trim(float(command["maxAge"]))
        if op == "pki":
            from tests.pki import Pki  # trustme: a CA and a server certificate for 127.0.0.1

            (self.directory / "pki").mkdir(exist_ok=True)
            pki = Pki(self.directory / "pki")
            cert, key = pki.server_files()
            return {"ca": str(pki.ca_file), "cert": str(cert), "key": str(key)}
        if op == "flush":
            await self.bucket.redis.flushall()  # type: ignore[attr-defined]
            return True
        raise ValueError(f"unknown op {op!r}")

    async def aclose(self) -> None:
        await self.bucket.aclose()
        if self.cluster_bucket is not None:
            await self.cluster_bucket.aclose()
        for process in self.publishers.values():
            process.stop()
        self.redis.stop()
        if self.cluster is not None:
            self.cluster.stop()


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="changefeed-js-") as tmp:
        fixture = Fixture(Path(tmp))
        loop = asyncio.get_running_loop()
        try:
            print(orjson.dumps({"ok": {"redis": fixture.redis.url}}).decode(), flush=True)
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:
                    break
                try:
                    answer = {"ok": await fixture.handle(orjson.loads(line))}
                except Exception as exc:  # reported to the test, which fails with it
                    answer = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
                print(orjson.dumps(answer).decode(), flush=True)
        finally:
            await fixture.aclose()


if __name__ == "__main__":
    asyncio.run(main())
