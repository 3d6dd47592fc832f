/**
 * The Listener over any Transport: registers, bootstraps while buffering, delivers in order,
 * resumes from its cursor on every reconnect (docs/protocol.md, listener/client.py).
 */
import { type BackoffOptions } from "./backoff.js";
import { type Plan, ListenerCore } from "./core.js";
import { Emitter } from "./emitter.js";
import {
    ChangefeedError, ConnectionLost, HttpError, ListenerClosed, OriginNotAllowed, ProtocolError, Unauthorized,
} from "./errors.js";
import { type ChangeItem, type Resource, type Watch } from "./protocol.js";
import { type ParsedCursor, parseCursor, reached } from "./cursor.js";
import { type Socket, type Transport } from "./transport.js";

/** A bunyan/pino-style logger; nothing is logged without one. */
export interface Logger {
    debug?(fields: object, message: string): void;
    info?(fields: object, message: string): void;
    warn?(fields: object, message: string): void;
    error?(fields: object, message: string): void;
}

export interface ListenerOptions {
    /** This listener's id (its UUID for Triton). */
    instance: string;
    service?: string;
    /** Resource name -> sub-resources to hear about (`["*"]`: all). */
    resources: Record<string, readonly string[]>;
    /** Resource name -> the ids and id prefixes to hear about (default: every id). */
    watches?: Record<string, Watch>;
    /** A cursor to resume after (the view the application kept); default: bootstrap. */
    since?: string;
    /** Ask for a coalesced catch-up instead of 4008 when falling behind. */
    coalesce?: boolean;
    /** False: do not walk the bootstrap routes; `bootstrapStart` events still say when to. */
    bootstrap?: boolean;
    /** Objects per bootstrap page (`?limit=`). */
    pageSize?: number;
    /** A bearer token (a config.js token or a JWT), or a function giving one, called before
     * every connection: a short-lived JWT is fetched again when the listener reconnects. */
    token?: string | (() => string | Promise<string>);
    backoff?: BackoffOptions;
    /** Seconds of streaming after which the backoff starts again from `initial`. */
    healthyAfter?: number;
    /** Seconds the websocket upgrade may take. */
    openTimeout?: number;
    /** Frames held before the socket is paused (the publisher then sees a slow consumer). */
    highWater?: number;
    log?: Logger;
    /** For tests: the jitter's random numbers. */
    random?: () => number;
}

export interface ChangeEvent {
    type: "change";
    item: ChangeItem;
    resource: string;
    id: string;
    subResources: string[];
    cursor: string;
    coalesced: boolean;
    caughtUp: boolean;
}

export type ListenerEvent =
    | { type: "resync"; reason: string }
    | { type: "bootstrapStart"; resource: string }
    | { type: "bootstrapRecords"; resource: string; objects: unknown[] }
    | { type: "bootstrapDone"; resource: string; cursor: string | null }
    | ChangeEvent;

export interface Registered {
    url: string;
    resumed: boolean;
    cursor: string | null;
    resources: Resource[];
    coalesce: boolean;
}

export interface ListenerEvents {
    /** The websocket to `url` is open; the registration follows. */
    open: (info: { url: string }) => void;
    registered: (info: Registered) => void;
    resync: (event: { type: "resync"; reason: string }) => void;
    bootstrapStart: (event: { type: "bootstrapStart"; resource: string }) => void;
    bootstrapRecords: (event: { type: "bootstrapRecords"; resource: string; objects: unknown[] }) => void;
    bootstrapDone: (event: { type: "bootstrapDone"; resource: string; cursor: string | null }) => void;
    change: (event: ChangeEvent) => void;
    /** A failure the listener retries after a backoff delay. */
    error: (error: Error) => void;
    /** A failure it does not retry: the listener has stopped. */
    fatal: (error: Error) => void;
    close: () => void;
}

interface Deferred<T> {
    promise: Promise<T>;
    resolve: (value: T) => void;
    reject: (error: Error) => void;
}

function deferred<T>(): Deferred<T> {
    let resolve!: (value: T) => void;
    let reject!: (error: Error) => void;
    const promise = new Promise<T>((res, rej) => {
        resolve = res;
        reject = rej;
    });
    return { promise, resolve, reject };
}

interface Waiter {
    wanted: ParsedCursor;
    done: Deferred<void>;
}

export class BaseListener extends Emitter<ListenerEvents> implements AsyncIterable<ListenerEvent> {
    protected readonly core: ListenerCore;
    private readonly options: ListenerOptions;
    private running: Promise<void> | null = null;
    private socket: Socket | null = null;
    private closed = false;
    private fatalError: Error | null = null;
    private sleeping: Deferred<void> | null = null;
    private delivered: string | null = null;
    private waiters = new Set<Waiter>();
    private iterating = false;
    private slot: { event: ListenerEvent; taken: Deferred<void> } | null = null;
    private consumer: Deferred<void> | null = null;
    private stopped = deferred<void>();
    private readonly aborter = new AbortController();

    constructor(
        private readonly transport: Transport,
        urls: string | readonly string[],
        options: ListenerOptions,
    ) {
        super();
        this.options = options;
        this.core = new ListenerCore(urls, {
            instance: options.instance,
            service: options.service ?? "",
            resources: options.resources,
            watches: options.watches ?? {},
            since: options.since,
            backoff: options.backoff,
            healthyAfter: options.healthyAfter ?? 30,
            bootstrap: options.bootstrap ?? true,
            coalesce: options.coalesce ?? false,
            random: options.random ?? Math.random,
        });
    }

    /** The cursor the listener resumes after: the last change handed over, or the bootstrap's. */
    get cursor(): string | null {
        return this.core.cursor;
    }

    /** The publisher of the current (or next) connection. */
    get url(): string {
        return this.core.url;
    }

    /** Start listening (events style). The async iterator starts it by itself. After a fatal
     * error (a refused token, origin or registration; the retries used up), start again, after
     * the cursor. */
    start(): this {
        if (this.closed) return this;
        if (this.running && this.finished) {
            this.running = null;
            this.finished = false;
            this.fatalError = null;
            this.stopped = deferred<void>();
            this.core.reopen();
        }
        if (!this.running) {
            const stopped = this.stopped;
            this.running = this.run().finally(() => stopped.resolve());
        }
        return this;
    }

    /** Resolves once the listener has stopped: close(), or a fatal error (which it rejects with). */
    async done(): Promise<void> {
        this.start();
        await this.stopped.promise;
        if (this.fatalError) throw this.fatalError;
    }

    /**
     * Resolves once this listener has handed over the change at `cursor` (what a commit
     * returned), a later change, or a bootstrap that began after it: read-your-writes.
     * Single-position cursors and the composite ones of a bucket in a Redis Cluster (reached when
     * each partition's position is). Throws CursorError at once when `cursor` is not a cursor;
     * rejects with CursorGone for a cursor of another bucket epoch than the listener's last
     * delivery, with CursorError for one of the other kind or partition count, with a
     * TimeoutError-named error after `timeout` seconds, with ListenerClosed on close().
     */
    async waitFor(cursor: string, options: { timeout?: number } = {}): Promise<void> {
        const waiter: Waiter = { wanted: parseCursor(cursor), done: deferred<void>() };
        if (this.check(waiter)) return;
        if (this.closed) throw new ListenerClosed();
        this.waiters.add(waiter);
        let timer: ReturnType<typeof setTimeout> | undefined;
        if (options.timeout !== undefined) {
            timer = setTimeout(() => {
                const error = new ChangefeedError(`cursor ${cursor} not reached within ${options.timeout} s`);
                error.name = "TimeoutError";
                waiter.done.reject(error);
            }, options.timeout * 1000);
        }
        try {
            await waiter.done.promise;
        } finally {
            clearTimeout(timer);
            this.waiters.delete(waiter);
        }
    }

    /** Stop: close the socket, end the iteration, cancel every timer and reconnection. */
    async close(): Promise<void> {
        if (this.closed) return;
        this.closed = true;
        this.core.close();
        this.aborter.abort();
        this.socket?.close(1000, "");
        this.sleeping?.resolve();
        this.slot?.taken.reject(new ListenerClosed());
        this.consumer?.resolve();
        for (const waiter of this.waiters) waiter.done.reject(new ListenerClosed());
        if (this.running) await this.running;
        else this.stopped.resolve();
    }

    [Symbol.asyncIterator](): AsyncIterator<ListenerEvent> {
        if (this.iterating) throw new Error("the listener is already being iterated");
        this.iterating = true;
        this.start();
        return {
            next: () => this.take(),
            return: async () => {
                await this.close();
                return { done: true, value: undefined };
            },
        };
    }

    private async take(): Promise<IteratorResult<ListenerEvent>> {
        // The event handed over last has been handled: let the run loop go on.
        if (this.slot && this.slotHanded) {
            const { taken } = this.slot;
            this.slot = null;
            this.slotHanded = false;
            taken.resolve();
        }
        while (!this.slot) {
            if (this.closed || this.finished) {
                if (this.fatalError) throw this.fatalError;
                return { done: true, value: undefined };
            }
            this.consumer = deferred<void>();
            await this.consumer.promise;
            this.consumer = null;
        }
        this.slotHanded = true;
        return { done: false, value: this.slot.event };
    }

    private slotHanded = false;
    /** The token of the current connection. */
    private token: string | undefined;
    private finished = false;

    /** Hand `event` to the application: events at once, the iterator when it asks. */
    private async deliver(event: ListenerEvent): Promise<void> {
        (this.emit as (name: string, event: ListenerEvent) => void)(event.type, event);
        if (!this.iterating || this.closed) return;
        this.slot = { event, taken: deferred<void>() };
        this.consumer?.resolve();
        await this.slot.taken.promise;
    }

    private advanced(cursor: string | null): void {
        if (cursor === null) return;
        this.delivered = cursor;
        for (const waiter of this.waiters) {
            try {
                if (this.check(waiter)) waiter.done.resolve();
            } catch (error) {
                waiter.done.reject(error as Error);
            }
        }
    }

    private check(waiter: Waiter): boolean {
        return reached(this.delivered, waiter.wanted);
    }

    private log(level: keyof Logger, fields: object, message: string): void {
        this.options.log?.[level]?.(fields, message);
    }

    private async run(): Promise<void> {
        try {
            while (!this.closed) {
                const attempt = this.core.attempt();
                this.log("info", { url: attempt.url, attempt: attempt.number, since: this.core.cursor }, "connecting");
                try {
                    await this.connection(attempt.wsUrl, attempt.frame, `~${attempt.version}`);
                } catch (caught) {
                    if (this.closed) break;
                    const error = this.translate(caught, attempt.url);
                    let delay: number;
                    try {
                        delay = this.core.failed(error, Date.now());
                    } catch (fatal) {
                        this.fatalError = fatal as Error;
                        this.log("error", { url: attempt.url, error: (fatal as Error).message }, "listener stopped");
                        this.emit("fatal", fatal as Error);
                        break;
                    }
                    this.log("warn", { url: attempt.url, error: error.message, delay }, "connection failed, retrying");
                    this.emit("error", error);
                    await this.sleep(delay);
                }
            }
        } finally {
            this.finished = true;
            this.socket = null;
            this.consumer?.resolve();
            for (const waiter of this.waiters) waiter.done.reject(this.fatalError ?? new ListenerClosed());
            this.emit("close");
        }
    }

    private translate(caught: unknown, url: string): Error {
        if (caught instanceof ChangefeedError) return caught;
        if (caught instanceof Error) return new ConnectionLost(url, 1006, caught.message);
        return new ConnectionLost(url, 1006, String(caught));
    }

    private sleep(seconds: number): Promise<void> {
        this.sleeping = deferred<void>();
        const timer = setTimeout(() => this.sleeping?.resolve(), seconds * 1000);
        return this.sleeping.promise.finally(() => {
            clearTimeout(timer);
            this.sleeping = null;
        });
    }

    private async connection(wsUrl: string, frame: string, acceptVersion: string): Promise<void> {
        const given = this.options.token;
        this.token = typeof given === "function" ? await given() : given;
        const socket = await this.transport.open(wsUrl, {
            acceptVersion, token: this.token, openTimeout: (this.options.openTimeout ?? 10) * 1000,
            signal: this.aborter.signal,
        });
        if (this.closed) {
            socket.close(1000, "");
            return;
        }
        this.socket = socket;
        try {
            this.emit("open", { url: this.core.url });
            socket.send(frame);
            const plan = this.core.reply(await socket.next(), Date.now());
            this.log("info", { url: this.core.url, resumed: plan.resumed, cursor: plan.cursor }, "registered");
            this.emit("registered", {
                url: this.core.url, resumed: plan.resumed, cursor: plan.cursor, resources: plan.reply,
                coalesce: plan.coalesce,
            });
            await this.bootstrap(plan);
            for (;;) {
                const item = this.core.item(await socket.next());
                if (item === null) continue;
                await this.deliver({
                    type: "change", item, resource: item.changeKind.resource, id: item.changedResourceId,
                    subResources: item.changeKind.subResources, cursor: item.cursor ?? "",
                    coalesced: item.coalesced === true, caughtUp: item.caughtUp === true,
                });
                if (this.closed) return;
                this.core.delivered(item);
                this.advanced(item.cursor && (item.caughtUp || !item.coalesced) ? item.cursor : null);
            }
        } finally {
            socket.close(1000, "");
            this.socket = null;
        }
    }

    private async bootstrap(plan: Plan): Promise<void> {
        if (plan.resync !== null) await this.deliver({ type: "resync", reason: plan.resync });
        if (!this.core.bootstrap && !plan.resumed) {
            // The application bootstraps by itself: tell it where (compat's 'bootstrap').
            for (const route of plan.reply) await this.deliver({ type: "bootstrapStart", resource: route.resource });
            this.advanced(plan.cursor);
            return;
        }
        for (const route of plan.routes) {
            await this.deliver({ type: "bootstrapStart", resource: route.resource });
            let url: string | null = this.core.bootstrapUrl(route.resource, this.options.pageSize ?? 100);
            while (url !== null && !this.closed) {
                const response = await this.transport.get(url, this.token, this.aborter.signal);
                if (response.status !== 200) throw httpError(url, response.status, response.body);
                let page: { items?: unknown; next?: unknown };
                try {
                    page = JSON.parse(response.body) as typeof page;
                } catch {
                    throw new ProtocolError(`bootstrap page ${url} is not JSON`);
                }
                if (!page || !Array.isArray(page.items)) throw new ProtocolError(`bootstrap page ${url} has no items list`);
                await this.deliver({ type: "bootstrapRecords", resource: route.resource, objects: page.items });
                url = typeof page.next === "string" && page.next ? new URL(page.next, url).toString() : null;
            }
            if (this.closed) return;
            const cursor = this.core.bootstrapDone(route.resource, Date.now());
            await this.deliver({ type: "bootstrapDone", resource: route.resource, cursor });
            this.advanced(cursor);
        }
    }
}

/** The publisher's JSON error (`{"code", "message"}`) as an HttpError: OriginNotAllowed for its
 * code, Unauthorized for other 401/403 answers. */
export function httpError(url: string, status: number, body: string): HttpError {
    let code = "";
    let detail = "";
    try {
        const parsed = JSON.parse(body) as { code?: unknown; message?: unknown };
        code = typeof parsed.code === "string" ? parsed.code : "";
        detail = typeof parsed.message === "string" ? parsed.message : "";
    } catch {
        detail = body.slice(0, 200);
    }
    const safe = url.replace(/([?&]access_token=)[^&]*/, "$1***");
    if (status === 403 && code === "OriginNotAllowed") return new OriginNotAllowed(safe, status, code, detail);
    return status === 401 || status === 403
        ? new Unauthorized(safe, status, code, detail)
        : new HttpError(safe, status, code, detail);
}
