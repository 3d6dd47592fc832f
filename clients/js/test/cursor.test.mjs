// Cursors as changefeed/cursor.py reads them, and `reached` as listener.Listener.wait_for uses
// it: single positions and the composite cursors of a bucket in a Redis Cluster. The encodings
// below were made by the Python package (Cursor.encode, CompositeCursor.encode/at).
import assert from "node:assert/strict";
import { test } from "node:test";
import { comparePositions, covers, parseCursor, reached } from "../dist/esm/cursor.js";
import { CursorError, CursorGone } from "../dist/esm/errors.js";

const E = "k2v7q4xa";
const MS = 1730000000454; // 0192cc0915c6
const single = (tail) => `${E}.${tail}`;

test("single-position cursors decode as Python's Cursor.decode", () => {
    assert.deepEqual(parseCursor(single("0192cc0915c6a3")), { kind: "single", text: single("0192cc0915c6a3"), epoch: E, position: { ms: MS, seq: 3n } });
    assert.equal(parseCursor(single("0192cc0915c6b10")).position.seq, 16n);
    assert.equal(parseCursor(single("0192cc0915c6pffffffffffffffff")).position.seq, 2n ** 64n - 1n, "seq beyond 2^53: exact");
    for (const bad of ["", "e.01", "k2v9q4xa.0192cc0915c6a3", "K2V9Q4XA.0192cc0915c6a3", `${E}.0192cc0915c6b3`, `${E}.0192cc0915a3`, `${E}.0192cc0915c6q3`, `${E}0192cc0915c6a3`]) {
        assert.throws(() => parseCursor(bad), (error) => error instanceof CursorError && error.cursor === bad, bad);
    }
    assert.throws(() => parseCursor(single("0192cc0915c6b3")), /sequence length does not match/);
    assert.throws(() => parseCursor(42), /a cursor is a string/);
});

test("composite cursors decode as Python's CompositeCursor.decode; empty is 0-0", () => {
    const text = `${E}~0192cc0915c6a3~~0192cc0915c7c1ff`;
    assert.deepEqual(parseCursor(text).positions, [{ ms: MS, seq: 3n }, { ms: 0, seq: 0n }, { ms: MS + 1, seq: 0x1ffn }]);
    assert.equal(parseCursor(text).kind, "composite");
    assert.deepEqual(parseCursor(`${E}~~0192cc0915cca2~`).positions.map((p) => p.ms), [0, MS + 6, 0]);
    assert.equal(parseCursor(`${E}~`).positions.length, 1);
    for (const bad of ["~0192cc0915c6a3", "E~0192cc0915c6a3", `${E}~zz`, `${E}~0192cc0915c6b3`, `${E}.0192cc0915c6a3~`]) {
        assert.throws(() => parseCursor(bad), CursorError, bad);
    }
    assert.throws(() => parseCursor(E + "~".repeat(1025)), /more than 1024 partitions/);
    assert.equal(parseCursor(E + "~".repeat(1024)).positions.length, 1024);
});

test("positions order by ms then seq, as numbers (a leading zero is the same position)", () => {
    const p = (tail) => parseCursor(single(tail)).position;
    assert.equal(comparePositions(p("0192cc0915c6a3"), p("0192cc0915c6b03")), 0);
    assert.equal(comparePositions(p("0192cc0915c6a9"), p("0192cc0915c6b10")), -1);
    assert.equal(comparePositions(p("0192cc0915c7a0"), p("0192cc0915c6pffffffffffffffff")), 1);
    assert.ok(covers([p("0192cc0915c6a3"), p("0192cc0915c6a1")], [p("0192cc0915c6a3"), p("0192cc0915c6a0")]));
    assert.ok(!covers([p("0192cc0915c6a3"), p("0192cc0915c6a1")], [p("0192cc0915c6a2"), p("0192cc0915c6a2")]));
    assert.ok(!covers([p("0192cc0915c6a3")], [p("0192cc0915c6a3"), p("0192cc0915c6a3")]), "other partitions");
});

test("reached: single positions, at or past", () => {
    const wanted = parseCursor(single("0192cc0915c6a3"));
    assert.equal(reached(null, wanted), false);
    assert.equal(reached(single("0192cc0915c6a2"), wanted), false);
    assert.equal(reached(single("0192cc0915c6b03"), wanted), true);
    assert.equal(reached(single("0192cc0915c6b10"), wanted), true);
    assert.equal(reached(single("0192cc0915c7a0"), wanted), true);
});

test("reached: a composite cursor when every partition's position is at or past it", () => {
    const wanted = parseCursor(`${E}~~0192cc0915cca2~`); // what a commit to partition 1 returns
    assert.equal(reached(`${E}~0192cc0915cda0~0192cc0915cca1~0192cc0915cda0`, wanted), false);
    assert.equal(reached(`${E}~~0192cc0915cca2~`, wanted), true);
    assert.equal(reached(`${E}~0192cc0915c6a3~0192cc0915cda0~`, wanted), true);
    const both = parseCursor(`${E}~0192cc0915c6a5~0192cc0915cca2~`);
    assert.equal(reached(`${E}~0192cc0915c6a4~0192cc0915cdaf~0192cc0915cdaf`, both), false, "one partition short");
    assert.equal(reached(`${E}~0192cc0915c6a5~0192cc0915cca2~`, both), true);
});

test("reached: another epoch is CursorGone; another kind or partition count is CursorError", () => {
    const other = "abcdefgh";
    assert.throws(() => reached(`${other}.0192cc0915c6a3`, parseCursor(single("0192cc0915c6a1"))),
        (error) => error instanceof CursorGone && /bucket epoch k2v7q4xa, the listener's is abcdefgh: the bucket was recreated/.test(error.message));
    assert.throws(() => reached(`${other}~~`, parseCursor(`${E}~~`)), CursorGone);
    assert.throws(() => reached(`${other}.0192cc0915c6a3`, parseCursor(`${E}~~`)), CursorGone, "the epoch first, as Python");
    assert.throws(() => reached(`${E}~~~`, parseCursor(`${E}~~`)), (error) => error instanceof CursorError
        && error.why === "a cursor of 2 partitions, the listener's has 3");
    assert.throws(() => reached(single("0192cc0915c6a3"), parseCursor(`${E}~~`)), /the other kind than the listener's/);
    assert.throws(() => reached(`${E}~~`, parseCursor(single("0192cc0915c6a3"))), /composite cursors belong to buckets in a Redis Cluster/);
});
