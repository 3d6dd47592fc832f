/**
 * Cursors, as changefeed/cursor.py reads them: pure code, for `waitFor` (read-your-writes).
 *
 * A single-position cursor is `<epoch>.<position>`; a bucket in a Redis Cluster gives composite
 * cursors, `<epoch>~<position of partition 0>~<position of partition 1>...` (a position per
 * partition, empty for nothing of that partition). A position is a Redis stream id `ms-seq`
 * written as `<ms: 12 hex digits><one letter a-p: the length of seq><seq in hex>`. A composite
 * cursor covers another of the same partitions when each of its positions is at or past the
 * other's; one of another bucket epoch is never compared (the bucket was recreated).
 */
import { CursorError, CursorGone } from "./errors.js";

const CURSOR_RE = /^([a-z2-7]{8,32})\.([0-9a-f]{12})([a-p])([0-9a-f]+)$/;
const POSITION_RE = /^([0-9a-f]{12})([a-p])([0-9a-f]+)$/;
const EPOCH_RE = /^[a-z2-7]{8,32}$/;
export const COMPOSITE_SEPARATOR = "~";
/** Most partitions a composite cursor carries (as changefeed/cursor.py's MAX_PARTITIONS). */
export const MAX_PARTITIONS = 1024;
const NOT_A_CURSOR = "not a cursor issued by this change feed";

/** A Redis stream id; `{ms: 0, seq: 0n}` is nothing (of a partition). */
export interface StreamId {
    ms: number;
    seq: bigint;
}

/** A decoded cursor; `text` is the cursor as given. */
export type ParsedCursor =
    | { kind: "single"; text: string; epoch: string; position: StreamId }
    | { kind: "composite"; text: string; epoch: string; positions: StreamId[] };

function decodePosition(ms: string, length: string, seq: string, whole: string): StreamId {
    if (seq.length !== length.charCodeAt(0) - "a".charCodeAt(0) + 1) {
        throw new CursorError(whole, "sequence length does not match");
    }
    return { ms: parseInt(ms, 16), seq: BigInt(`0x${seq}`) };
}

function decodeComposite(text: string): ParsedCursor {
    const [epoch = "", ...pieces] = text.split(COMPOSITE_SEPARATOR);
    if (pieces.length === 0 || !EPOCH_RE.test(epoch)) throw new CursorError(text, NOT_A_CURSOR);
    if (pieces.length > MAX_PARTITIONS) throw new CursorError(text, `more than ${MAX_PARTITIONS} partitions`);
    const positions = pieces.map((piece) => {
        if (piece === "") return { ms: 0, seq: 0n };
        const match = POSITION_RE.exec(piece);
        if (match === null) throw new CursorError(text, NOT_A_CURSOR);
        return decodePosition(match[1]!, match[2]!, match[3]!, text);
    });
    return { kind: "composite", text, epoch, positions };
}

/** A single-position or a composite cursor; CursorError when `text` is neither. */
export function parseCursor(text: string): ParsedCursor {
    if (typeof text !== "string") throw new CursorError(String(text), "a cursor is a string");
    if (text.includes(COMPOSITE_SEPARATOR)) return decodeComposite(text);
    const match = CURSOR_RE.exec(text);
    if (match === null) throw new CursorError(text, NOT_A_CURSOR);
    return { kind: "single", text, epoch: match[1]!, position: decodePosition(match[2]!, match[3]!, match[4]!, text) };
}

/** -1, 0 or 1 as `a` is before, at or after `b`. */
export function comparePositions(a: StreamId, b: StreamId): number {
    if (a.ms !== b.ms) return a.ms < b.ms ? -1 : 1;
    return a.seq === b.seq ? 0 : a.seq < b.seq ? -1 : 1;
}

/** True when every position of `other` is at or before `mine`'s (the same partitions). */
export function covers(mine: readonly StreamId[], other: readonly StreamId[]): boolean {
    return mine.length === other.length && mine.every((position, i) => comparePositions(position, other[i]!) >= 0);
}

/**
 * True when a listener whose last delivery (a change, or a complete bootstrap) had cursor
 * `delivered` has handed over the change at `wanted`, or a later state of it.
 * Throws CursorGone when `delivered` is of another epoch (the bucket was recreated between the
 * two), CursorError when the two are of different kinds or partition counts.
 */
export function reached(delivered: string | null, wanted: ParsedCursor): boolean {
    if (delivered === null) return false;
    const have = parseCursor(delivered);
    if (have.epoch !== wanted.epoch) {
        throw new CursorGone(`cursor ${wanted.text} is of bucket epoch ${wanted.epoch}, the listener's is `
            + `${have.epoch}: the bucket was recreated; its bootstrap is the state to trust`);
    }
    if (have.kind === "composite" && wanted.kind === "composite") {
        if (have.positions.length !== wanted.positions.length) {
            throw new CursorError(wanted.text, `a cursor of ${wanted.positions.length} partitions, the `
                + `listener's has ${have.positions.length}`);
        }
        return covers(have.positions, wanted.positions);
    }
    if (have.kind === "single" && wanted.kind === "single") {
        return comparePositions(have.position, wanted.position) >= 0;
    }
    throw new CursorError(wanted.text, "a cursor of the other kind than the listener's (composite "
        + "cursors belong to buckets in a Redis Cluster)");
}
