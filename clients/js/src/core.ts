/**
 * The listener's state machine: pure code, no sockets, clocks or timers (as listener/state.py).
 *
 *     attempt()                -> where to connect and the registration frame to send
 *     reply(text, now)         -> resumed, or the resync reason and the routes to bootstrap
 *     item(text)               -> the change item in a frame after the reply (null: heartbeat,
 *                                 or outside the watch)
 *     bootstrapDone(resource)  -> the cursor, on the last resource of a bootstrap
 *     delivered(item)          -> the cursor moves past the item
 *     failed(error, now)       -> the seconds before the next attempt, or throws the fatal error
 *
 * Phases: idle -> registering -> (bootstrapping ->) streaming; a failure -> backingOff ->
 * registering on the next URL; a fatal failure or close() -> closed; reopen() -> idle.
 */
import { Backoff, type BackoffOptions } from "./backoff.js";
import {
    ConnectionLost, RegistrationRejected, RetriesExhausted, ProtocolError, isRetryable,
} from "./errors.js";
import {
    type ChangeItem, type ChangeKind, type Resource, type Watch, HEARTBEAT, REGISTRATION_TIMEOUT,
    REJECTIONS, SINCE_REFUSED, isReply, parseItem, parseJsonObject, parseReply, publisherUrls, watchMatches,
} from "./protocol.js";

export type Phase = "idle" | "registering" | "bootstrapping" | "streaming" | "backingOff" | "closed";

export interface CoreOptions {
    instance: string;
    service?: string;
    /** Resource name -> sub-resources (`["*"]` for all). */
    resources: Record<string, readonly string[]>;
    watches?: Record<string, Watch>;
    since?: string | undefined;
    backoff?: BackoffOptions | undefined;
    /** Seconds of streaming after which the backoff starts again from `initial`. */
    healthyAfter?: number;
    /** False: never bootstrap (the application does, on `resync`/`bootstrap`). */
    bootstrap?: boolean;
    coalesce?: boolean;
    random?: () => number;
}

export interface Attempt {
    number: number;
    url: string;
    wsUrl: string;
    version: 1 | 2;
    frame: string;
}

export interface Plan {
    resumed: boolean;
    /** Why the view must be dropped, when the listener had one and cannot resume. */
    resync: string | null;
    /** The resources to bootstrap, in registration order (empty when resumed). */
    routes: Resource[];
    /** Every entry of the reply, in registration order. */
    reply: Resource[];
    cursor: string | null;
    coalesce: boolean;
}

export class ListenerCore {
    readonly urls: [string, string][];
    readonly kinds: ChangeKind[];
    readonly instance: string;
    readonly service: string;
    readonly version: 1 | 2;
    readonly bootstrap: boolean;
    readonly coalesce: boolean;
    phase: Phase = "idle";
    routes = new Map<string, Resource>();
    failures = 0;
    private readonly watches: Record<string, Watch>;
    private readonly backoff: Backoff;
    private readonly healthyAfter: number;
    private readonly random: () => number;
    private delays: Generator<number, void, undefined>;
    private healthySince: number | null = null;
    private cursorValue: string | null;
    private hasView: boolean;
    private bootstrapCursor: string | null = null;
    private pending: string[] = [];
    private urlIndex = 0;
    private attempts = 0;

    constructor(urls: string | readonly string[], options: CoreOptions) {
        const listed = typeof urls === "string" ? [urls] : [...urls];
        if (listed.length === 0) throw new TypeError("a listener needs at least one publisher URL");
        this.urls = listed.map(publisherUrls);
        if (!options.instance || typeof options.instance !== "string") {
            throw new TypeError("a listener needs an instance id (options.instance)");
        }
        const names = Object.keys(options.resources ?? {});
        if (names.length === 0) throw new TypeError("a listener needs at least one resource (options.resources)");
        this.watches = options.watches ?? {};
        const unknown = Object.keys(this.watches).filter((name) => !names.includes(name));
        if (unknown.length) throw new TypeError(`watches name resources not in resources: ${unknown.join(", ")}`);
        this.kinds = names.map((name) => {
            const subs = options.resources[name];
            if (!Array.isArray(subs) || subs.length === 0 || subs.some((s) => typeof s !== "string")) {
                throw new TypeError(`resources.${name}: sub-resources must be a non-empty list of strings`);
            }
            const kind: ChangeKind = { resource: name, subResources: [...new Set(subs as string[])] };
            const watch = this.watches[name];
            if (watch?.ids?.length) kind.ids = [...watch.ids];
            if (watch?.prefixes?.length) kind.prefixes = [...watch.prefixes];
            return kind;
        });
        this.instance = options.instance;
        this.service = options.service ?? "";
        this.version = this.kinds.length === 1 ? 1 : 2;
        this.bootstrap = options.bootstrap ?? true;
        this.coalesce = options.coalesce ?? false;
        this.backoff = new Backoff(options.backoff);
        this.healthyAfter = options.healthyAfter ?? 30;
        this.random = options.random ?? Math.random;
        this.delays = this.backoff.delays(this.random);
        this.cursorValue = options.since ?? null;
        this.hasView = this.cursorValue !== null;
    }

    /** Where the application's view is: the listener resumes after it. */
    get cursor(): string | null {
        return this.cursorValue;
    }

    /** The base URL of the publisher of the current (or next) attempt. */
    get url(): string {
        return this.urls[this.urlIndex]![0];
    }

    attempt(): Attempt {
        if (this.phase !== "idle" && this.phase !== "backingOff") {
            throw new Error(`cannot connect while ${this.phase}`);
        }
        this.phase = "registering";
        this.attempts += 1;
        const [url, wsUrl] = this.urls[this.urlIndex]!;
        const registration: Record<string, unknown> = { instance: this.instance, service: this.service };
        if (this.version === 1) registration["changeKind"] = this.kinds[0];
        else registration["resources"] = this.kinds;
        if (this.cursorValue !== null) registration["since"] = this.cursorValue;
        if (this.coalesce) registration["coalesce"] = true;
        return { number: this.attempts, url, wsUrl, version: this.version, frame: JSON.stringify(registration) };
    }

    reply(text: string, now: number): Plan {
        this.expect("registering");
        const reply = parseReply(parseJsonObject(text));
        const byName = new Map(reply.routes.map((route) => [route.resource, route]));
        const missing = this.kinds.filter((kind) => !byName.has(kind.resource)).map((kind) => kind.resource);
        if (missing.length) throw new ProtocolError(`registration reply lacks the resources ${missing.join(", ")}`);
        this.routes = byName;
        const ordered = this.kinds.map((kind) => byName.get(kind.resource)!);
        const coalesce = this.coalesce && reply.coalesce;
        if (reply.resumed && this.cursorValue !== null) {
            this.streaming(now);
            return { resumed: true, resync: null, routes: [], reply: ordered, cursor: reply.cursor, coalesce };
        }
        let resync: string | null = null;
        if (this.hasView) {
            resync = this.cursorValue === null
                ? "no cursor to resume from"
                : `the publisher cannot resume after cursor ${this.cursorValue}`;
        }
        this.hasView = false;
        this.cursorValue = null;
        this.bootstrapCursor = reply.cursor;
        if (!this.bootstrap) {
            this.hasView = true;
            this.cursorValue = reply.cursor;
            this.streaming(now);
            return { resumed: false, resync, routes: [], reply: ordered, cursor: reply.cursor, coalesce };
        }
        this.pending = this.kinds.map((kind) => kind.resource);
        this.phase = "bootstrapping";
        return { resumed: false, resync, routes: ordered, reply: ordered, cursor: reply.cursor, coalesce };
    }

    /** The absolute URL of `resource`'s bootstrap route on the current publisher. */
    routeUrl(resource: string): string {
        const route = this.routes.get(resource);
        if (!route) throw new ProtocolError(`no bootstrap route known for ${resource}`);
        return new URL(route.bootstrapRoute.replace(/^\/+/, ""), this.url + "/").toString();
    }

    /** The first page of `resource`'s bootstrap: its route with `limit`, narrowed by the watch. */
    bootstrapUrl(resource: string, limit: number): string {
        const url = new URL(this.routeUrl(resource));
        url.searchParams.set("limit", String(limit));
        const kind = this.kinds.find((k) => k.resource === resource);
        for (const id of kind?.ids ?? []) url.searchParams.append("id", id);
        for (const prefix of kind?.prefixes ?? []) url.searchParams.append("prefix", prefix);
        return url.toString();
    }

    /** `resource` is bootstrapped: the cursor the view now reflects when it was the last. */
    bootstrapDone(resource: string, now: number): string | null {
        this.expect("bootstrapping");
        this.pending = this.pending.filter((name) => name !== resource);
        if (this.pending.length) return null;
        this.hasView = true;
        this.cursorValue = this.bootstrapCursor;
        this.streaming(now);
        return this.cursorValue;
    }

    item(text: string): ChangeItem | null {
        if (text === HEARTBEAT) return null;
        const frame = parseJsonObject(text);
        if (isReply(frame)) throw new ProtocolError("a second registration reply on one connection");
        const item = parseItem(frame);
        const kind = this.kinds.find((k) => k.resource === item.changeKind.resource);
        if (!kind || !(kind.subResources.includes("*")
            || item.changeKind.subResources.some((sub) => kind.subResources.includes(sub)))) {
            throw new ProtocolError(
                `change item of ${item.changeKind.resource} [${item.changeKind.subResources.join(", ")}]: not registered for it`);
        }
        return watchMatches(this.watches[kind.resource], item.changedResourceId) ? item : null;
    }

    /** `item` goes to the application: the listener resumes after it (a coalesced item only
     * when it is the last of its catch-up). */
    delivered(item: ChangeItem): void {
        this.expect("streaming");
        if (item.cursor && (item.caughtUp || !item.coalesced)) this.cursorValue = item.cursor;
    }

    /** The current attempt failed: the seconds to wait before the next one, or throws. */
    failed(error: Error, now: number): number {
        const registering = this.phase === "registering";
        if (this.phase === "bootstrapping") this.pending = [];
        if (registering && error instanceof ConnectionLost && REJECTIONS.has(error.closeCode)) {
            if (error.reason.startsWith(SINCE_REFUSED) && this.cursorValue !== null) {
                this.cursorValue = null;
            } else if (!error.reason.startsWith(REGISTRATION_TIMEOUT)) {
                this.phase = "closed";
                throw new RegistrationRejected(error.url, error.closeCode, error.reason);
            }
        }
        const since = this.healthySince;
        this.healthySince = null;
        if (since !== null && now - since >= this.healthyAfter * 1000) this.answered();
        if (!isRetryable(error)) {
            this.phase = "closed";
            throw error;
        }
        this.failures += 1;
        const next = this.delays.next();
        if (next.done) {
            this.phase = "closed";
            throw new RetriesExhausted(this.failures, error);
        }
        this.urlIndex = (this.urlIndex + 1) % this.urls.length;
        this.phase = "backingOff";
        return next.value;
    }

    close(): void {
        this.phase = "closed";
    }

    /** Connect again after a fatal failure (its cause mended): after the cursor, with the
     * backoff from its start. */
    reopen(): void {
        this.expect("closed");
        this.phase = "idle";
        this.failures = 0;
        this.delays = this.backoff.delays(this.random);
    }

    private answered(): void {
        if (this.failures) {
            this.failures = 0;
            this.delays = this.backoff.delays(this.random);
        }
    }

    private streaming(now: number): void {
        this.phase = "streaming";
        this.healthySince = now;
    }

    private expect(phase: Phase): void {
        if (this.phase !== phase) throw new Error(`listener is ${this.phase}, expected ${phase}`);
    }
}
