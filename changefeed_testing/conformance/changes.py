"""How the conformance run causes a change on the publisher under test.

The item and resume checks need changes they know about. Two ways:

- `BucketChanges`: commit through the publisher's own bucket, read from its config.js
  (`--config FILE`). Only the change item is appended (`ChangeBucket.publish`): no state is
  stored, so a listener that fetches the object finds it gone.
- `CommandChanges`: run a shell command (`--publish-command`), for any other publisher.
  `{resource}`, `{id}` and `{sub}` in it are replaced by the (shell-quoted) change to make; the
  last line of its output is taken as the item's cursor when it looks like one.

Without either, those checks can only look at items that happen to arrive, or say they could not
run.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from changefeed_testing.conformance.outcome import Failed

if TYPE_CHECKING:
    from publisher import ChangeBucket


class ChangeMaker(Protocol):
    """Causes one change item; returns its cursor when it knows it."""

    async def make(self, resource: str, id: str, sub: str) -> str | None: ...

    async def aclose(self) -> None: ...


class BucketChanges:
    """Commits change items through a `ChangeBucket` on the publisher's Redis."""

    def __init__(self, bucket: ChangeBucket) -> None:
        self.bucket = bucket

    @classmethod
    def from_config(cls, path: Path, redis_url: str) -> BucketChanges:
        """The bucket of the config.js at `path`, on `redis_url` (the config's own, or the
        embedded Redis the caller found)."""
        from publisher import ChangeBucket, connect, load_config

        config = load_config(path)
        return cls(ChangeBucket(connect(redis_url), config.bucket.name, config.resources,
                                config.bucket.partitions))

    async def make(self, resource: str, id: str, sub: str) -> str | None:
        from changefeed.errors import ChangefeedError

        try:
            return await self.bucket.publish(resource, id, [sub])
        except ChangefeedError as exc:
            raise Failed(f"could not commit a change through the bucket: {exc}") from None

    async def aclose(self) -> None:
        await self.bucket.aclose()


class CommandChanges:
    """Runs a shell command per change, e.g. `changefeed publish --config c.js {resource} {id}
    --sub {sub}`."""

    def __init__(self, template: str, timeout: float) -> None:
        self.template = template
        self.timeout = timeout

    def command(self, resource: str, id: str, sub: str) -> str:
        return (self.template.replace("{resource}", shlex.quote(resource))
                .replace("{id}", shlex.quote(id)).replace("{sub}", shlex.quote(sub)))

    async def make(self, resource: str, id: str, sub: str) -> str | None:
        from changefeed.cursor import Position
        from changefeed.errors import CursorError

        command = self.command(resource, id, sub)
        process = await asyncio.create_subprocess_shell(
            command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise Failed(f"the publish command did not finish within {self.timeout:g} s: "
                         f"{command}") from None
        text = output.decode(errors="replace").strip()
        if process.returncode != 0:
            raise Failed(f"the publish command failed ({process.returncode}): {command}: "
                         f"{text[-200:]}")
        last = text.splitlines()[-1].strip() if text else ""
        try:
            return Position.decode_single(last).encode()
        except CursorError:
            return None

    async def aclose(self) -> None:
        return None
