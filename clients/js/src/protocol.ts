/**
 * The wire protocol (docs/protocol.md): registration frames, the registration reply, change
 * items, close codes. Pure code, shared by the Node and browser builds.
 */
import { ProtocolError } from "./errors.js";

export const CHANGEFEEDS = "/changefeeds";
export const HEARTBEAT = "heartbeat";
/** The subprotocol a listener offers first; the publisher selects it (docs/security.md). */
export const SUBPROTOCOL = "changefeed";
/** Prefix of the subprotocol value that carries a bearer token from a browser. */
export const BEARER_SUBPROTOCOL = "changefeed.bearer.";

export const CloseCode = {
    NORMAL: 1000,
    GOING_AWAY: 1001,
    UNSUPPORTED_DATA: 1003,
    ABNORMAL: 1006,
    POLICY_VIOLATION: 1008,
    MESSAGE_TOO_BIG: 1009,
    TRY_AGAIN_LATER: 1013,
    SLOW_CONSUMER: 4008,
    BOOTSTRAP_AGAIN: 4009,
    OVERLOADED: 4029,
} as const;

/** Close codes refusing a registration: retrying would be refused again (except the two
 * 1008 reasons below). */
export const REJECTIONS: ReadonlySet<number> = new Set([1002, 1003, 1007, 1008, 1009]);
/** The start of a 1008 reason refusing the `since` cursor: drop it and bootstrap. */
export const SINCE_REFUSED = "since:";
/** The start of a 1008 reason for a registration that came too late: just reconnect. */
export const REGISTRATION_TIMEOUT = "no registration within";

/** Exact ids and `/`-separated id prefixes a change kind is narrowed to (docs/protocol.md). */
export interface Watch {
    ids?: readonly string[];
    prefixes?: readonly string[];
}

export interface ChangeKind {
    resource: string;
    subResources: string[];
    ids?: string[];
    prefixes?: string[];
}

/** A resource as `GET /changefeeds` and the registration reply describe it. */
export interface Resource {
    resource: string;
    subResources: string[];
    bootstrapRoute: string;
}

/** One change item, as the publisher sends it. */
export interface ChangeItem {
    changeKind: { resource: string; subResources: string[] };
    changedResourceId: string;
    published?: string;
    cursor?: string;
    coalesced?: boolean;
    caughtUp?: boolean;
}

export interface Reply {
    routes: Resource[];
    cursor: string | null;
    resumed: boolean;
    coalesce: boolean;
}

export function parseJsonObject(text: string): Record<string, unknown> {
    let value: unknown;
    try {
        value = JSON.parse(text);
    } catch {
        throw new ProtocolError(`frame is not JSON: ${text.slice(0, 200)}`);
    }
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
        throw new ProtocolError(`frame is not a JSON object: ${text.slice(0, 200)}`);
    }
    return value as Record<string, unknown>;
}

export function isReply(frame: Record<string, unknown>): boolean {
    return "bootstrapRoute" in frame || "bootstrapRoutes" in frame;
}

function resourceOf(value: unknown): Resource {
    const entry = value as Partial<Resource> | null;
    if (!entry || typeof entry.resource !== "string" || typeof entry.bootstrapRoute !== "string"
        || !Array.isArray(entry.subResources)) {
        throw new ProtocolError(`registration reply entry is not a resource: ${JSON.stringify(value)}`);
    }
    return { resource: entry.resource, subResources: entry.subResources, bootstrapRoute: entry.bootstrapRoute };
}

/** The registration reply (v1: one entry; v2: `bootstrapRoutes`). */
export function parseReply(frame: Record<string, unknown>): Reply {
    if (!isReply(frame)) {
        throw new ProtocolError(`expected a registration reply, got ${JSON.stringify(frame).slice(0, 200)}`);
    }
    const routes = "bootstrapRoutes" in frame
        ? (Array.isArray(frame["bootstrapRoutes"]) ? frame["bootstrapRoutes"].map(resourceOf) : [])
        : [resourceOf(frame)];
    const cursor = typeof frame["cursor"] === "string" && frame["cursor"] ? frame["cursor"] : null;
    return { routes, cursor, resumed: frame["resumed"] === true, coalesce: frame["coalesce"] === true };
}

export function parseItem(frame: Record<string, unknown>): ChangeItem {
    const kind = frame["changeKind"] as { resource?: unknown; subResources?: unknown } | undefined;
    if (!kind || typeof kind.resource !== "string" || !Array.isArray(kind.subResources)
        || typeof frame["changedResourceId"] !== "string") {
        throw new ProtocolError(`not a change item: ${JSON.stringify(frame).slice(0, 200)}`);
    }
    return frame as unknown as ChangeItem;
}

/** Whether `id` is one of the watch's ids or lies under one of its prefixes (whole segments). */
export function watchMatches(watch: Watch | undefined, id: string): boolean {
    const ids = watch?.ids ?? [];
    const prefixes = watch?.prefixes ?? [];
    if (ids.length === 0 && prefixes.length === 0) return true;
    if (ids.includes(id)) return true;
    return prefixes.some((raw) => {
        const prefix = raw.replace(/\/+$/, "");
        return id === prefix || id.startsWith(prefix + "/");
    });
}

/** `http(s)://host[:port][/path]` (or ws(s)://, or ending in /changefeeds): [base, websocket]. */
export function publisherUrls(url: string): [string, string] {
    let parsed: URL;
    try {
        parsed = new URL(url.trim());
    } catch {
        throw new TypeError(`publisher URL ${JSON.stringify(url)}: expected http://host:port (or ws://, https://)`);
    }
    const schemes: Record<string, string> = { "http:": "http", "ws:": "http", "https:": "https", "wss:": "https" };
    const scheme = schemes[parsed.protocol];
    if (!scheme || !parsed.host) {
        throw new TypeError(`publisher URL ${JSON.stringify(url)}: expected http://host:port (or ws://, https://)`);
    }
    let path = parsed.pathname.replace(/\/+$/, "");
    if (path.endsWith(CHANGEFEEDS)) path = path.slice(0, -CHANGEFEEDS.length);
    const base = `${scheme}://${parsed.host}${path}`;
    const ws = `${scheme === "https" ? "wss" : "ws"}://${parsed.host}${path}${CHANGEFEEDS}`;
    return [base, ws];
}
