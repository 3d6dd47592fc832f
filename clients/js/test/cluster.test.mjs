// waitFor() with the composite cursors of a bucket in a Redis Cluster: a real 3-master cluster,
// a publisher on it by a redis+cluster:// URL, commits to several partitions (test/fixture.py).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { CursorError, CursorGone, Listener } from "../dist/esm/index.js";
import { FAST, Fixture, sleep } from "./harness.mjs";

const PARTITIONS = 4;
let fixture;
before(async () => { fixture = await Fixture.start(); });
after(async () => { await fixture?.close(); });

/** The partitions whose position a commit's composite cursor names. */
const partitionsOf = (cursor) => cursor.split("~").slice(1).flatMap((piece, i) => (piece ? [i] : []));

test("waitFor(composite cursor): resolves once seen, times out before, errs on another epoch or shape", async () => {
    const { url } = await fixture.cluster(PARTITIONS);
    const feed = new Listener(url, { instance: "i-cluster", resources: { vm: ["nic"] }, backoff: FAST }).start();
    try {
        const changes = [];
        for (let n = 0; n < 12; n++) changes.push(["vm", `c-${n}`, ["nic"]]);
        const cursors = await fixture.commitTo("cluster", ...changes);
        const [epoch] = cursors[0].split("~");
        for (const cursor of cursors) {
            assert.equal(cursor.split("~").length, PARTITIONS + 1, cursor);
            assert.equal(partitionsOf(cursor).length, 1, "a commit's cursor names its own partition");
        }
        assert.ok(new Set(cursors.flatMap(partitionsOf)).size >= 2, `several partitions: ${cursors}`);
        await Promise.all(cursors.map((cursor) => feed.waitFor(cursor, { timeout: 20 })));
        assert.equal(feed.cursor.split("~")[0], epoch);
        assert.equal(feed.cursor.split("~").length, PARTITIONS + 1);

        // Not reached yet: a position in each of those partitions past every commit so far
        // (stream ids are the Redis clock's milliseconds); reached once they get a commit more.
        const used = new Set(cursors.flatMap(partitionsOf));
        const ms = (Date.now() + 1).toString(16).padStart(12, "0");
        const ahead = epoch + [...Array(PARTITIONS).keys()].map((p) => (used.has(p) ? `~${ms}a0` : "~")).join("");
        await assert.rejects(feed.waitFor(ahead, { timeout: 0.3 }), { name: "TimeoutError" });
        let settled = false;
        const waiting = feed.waitFor(ahead, { timeout: 20 }).finally(() => { settled = true; });
        await sleep(200);
        assert.equal(settled, false, "nothing committed: still waiting");
        await fixture.commitTo("cluster", ...changes); // the same ids: the same partitions
        await waiting;

        // As Listener.wait_for: another epoch is CursorGone, another shape CursorError.
        await assert.rejects(feed.waitFor(`abcdefgh${"~".repeat(PARTITIONS)}`, { timeout: 5 }), CursorGone);
        await assert.rejects(feed.waitFor(`${epoch}~~`, { timeout: 5 }),
            (error) => error instanceof CursorError && /a cursor of 2 partitions, the listener's has 4/.test(error.message));
        await assert.rejects(feed.waitFor(`${epoch}.0192cc0915c6a3`, { timeout: 5 }), /the other kind than the listener's/);
        await assert.rejects(feed.waitFor(`${epoch}~zz~~~`, { timeout: 5 }), CursorError);
    } finally {
        await feed.close();
    }
});
