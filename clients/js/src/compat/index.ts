/**
 * A drop-in for Joyent's `changefeed` npm Listener (node-sdc-changefeed 1.5): the same
 * constructor options, events and methods, on this package's Listener, so that a Triton service
 * changes one `require` and resumes by cursor across reconnects.
 *
 * ```js
 * const changefeed = require("changefeed-listener/compat");   // was require("changefeed")
 * const listener = changefeed.createListener({log, url, instance, service,
 *                                             changeKind: {resource: "vm", subResources: ["nic"]}});
 * listener.on("bootstrap", (entry) => walk(entry.bootstrapRoute));
 * listener.on("readable", () => { let item; while ((item = listener.read()) !== null) handle(item); });
 * listener.register();
 * ```
 *
 * Its events are Joyent's: `bootstrap` per resource of every registration reply, `readable`,
 * `connection-reset` when the websocket ends without a close frame, then `connection-end` each
 * time the websocket ends (close() included, before it returns), `error` with `Backoff failed`
 * once `backoff.retries` are spent, and nothing after close(). A failed attempt to connect is
 * only logged, as Joyent's failed `GET /changefeeds` was. What it adds: every reconnect resumes
 * after the last item pushed, so the changes of the gap are pushed too (Joyent's lost them);
 * `bootstrapWhenResumed: false` leaves out the `bootstrap` of a reconnect that resumed. The
 * differences from Joyent's are in the package README.
 */
import { Readable } from "node:stream";
import { ConnectionLost, ProtocolError, RetriesExhausted } from "../errors.js";
import { Listener, type NodeListenerOptions } from "../index.js";
import { type Logger } from "../listener.js";
import { type ChangeKind, type ChangeItem, type Resource } from "../protocol.js";
import { type TlsOptions } from "../node/transport.js";

/** Joyent's backoff options, in milliseconds. */
export interface CompatBackoff {
    minTimeout?: number;
    maxTimeout?: number;
    retries?: number;
}

export interface CompatOptions {
    /** A bunyan-style logger (Joyent's required one; optional here). */
    log?: Logger & { trace?(fields: object, message: string): void };
    instance: string;
    service: string;
    url?: string;
    /** Before restify-clients: `http://<endpoint>[:<port>]`. */
    endpoint?: string;
    port?: number;
    /** One resource (v1 registration)... */
    changeKind?: { resource: string; subResources: string[] };
    /** ...or several (v2). */
    resources?: Array<{ resource: string; subResources: string[] }>;
    /** Joyent's `changeKinds` spelling of `resources`. */
    changeKinds?: Array<{ resource: string; subResources: string[] }>;
    backoff?: CompatBackoff;
    /** Extensions: false: no `bootstrap` on a reconnect that resumed (the view is whole: every
     * change since is pushed); only when the publisher cannot resume. Default true: Joyent's
     * `bootstrap` at every registration. */
    bootstrapWhenResumed?: boolean;
    /** Extensions: a bearer token, TLS options, more publisher URLs to fail over to. */
    token?: string;
    tls?: TlsOptions;
    urls?: string[];
}

function kindsOf(options: CompatOptions): ChangeKind[] {
    const listed = options.resources ?? options.changeKinds;
    if (listed && options.changeKind) {
        throw new TypeError("options.changeKind and options.resources exclude each other");
    }
    const kinds = listed ?? (options.changeKind ? [options.changeKind] : []);
    if (!Array.isArray(kinds) || kinds.length === 0) {
        throw new TypeError("options.changeKind (an object) or options.resources (a non-empty array) is required");
    }
    kinds.forEach((kind, i) => {
        if (!kind || typeof kind.resource !== "string" || !Array.isArray(kind.subResources)) {
            throw new TypeError(`options.resources[${i}]: {resource: string, subResources: string[]} expected`);
        }
    });
    return kinds;
}

function urlOf(options: CompatOptions): string {
    if (options.endpoint && options.port) {
        return `http://${options.endpoint}${options.port !== 80 ? `:${options.port}` : ""}`;
    }
    if (typeof options.url !== "string") throw new TypeError("options.url (a string) is required");
    return options.url;
}

export class CompatListener extends Readable {
    readonly url: string;
    readonly instance: string;
    readonly service: string;
    readonly resources: ChangeKind[];
    private readonly options: CompatOptions;
    private listener: Listener | null = null;
    private pending: ChangeItem[] = [];
    /** _read() asked for an item and none was pending: push the next at once. */
    private wanted = false;
    /** The websocket is open: its end is a `connection-end`. */
    private open = false;
    // Not `closed`: on Node 18 and later Readable.prototype.closed is a getter, and Joyent's
    // `this.closed = true` was silently ignored (its close() did not stop the reconnects).
    #stopped = false;

    constructor(options: CompatOptions) {
        // One item buffered at a time, the others wait in `pending` until read() asks (_read):
        // each item gets a 'readable' of its own, as Joyent's tests, which read() one item per
        // 'readable', expect (items arriving in one tick would share one 'readable').
        super({ objectMode: true, highWaterMark: 1 });
        if (!options || typeof options !== "object") throw new TypeError("options (object) is required");
        if (typeof options.instance !== "string") throw new TypeError("options.instance (string) is required");
        if (typeof options.service !== "string") throw new TypeError("options.service (string) is required");
        this.options = options;
        this.url = urlOf(options);
        this.instance = options.instance;
        this.service = options.service;
        this.resources = kindsOf(options);
    }

    /** The cursor the listener resumes after (an extension). */
    get cursor(): string | null {
        return this.listener?.cursor ?? null;
    }

    /** Connect, register, and keep reconnecting (resuming) until close(), the retries spent or a
     * refusal (`error`); register() again then starts again. */
    register(): void {
        if (this.#stopped) return;
        if (this.listener) {
            this.listener.start(); // again after an `error` that stopped it; else nothing
            return;
        }
        const options = this.options;
        const backoff = options.backoff ?? {};
        const maxTimeout = backoff.maxTimeout !== undefined && Number.isFinite(backoff.maxTimeout)
            ? backoff.maxTimeout : 10000;
        const minTimeout = Math.max(1, Math.min(backoff.minTimeout ?? 100, maxTimeout));
        const listenerOptions: NodeListenerOptions = {
            instance: this.instance,
            service: this.service,
            resources: Object.fromEntries(this.resources.map((kind) => [kind.resource, kind.subResources])),
            bootstrap: false,
            // Joyent's backoff starts again at every registration reply, and has no jitter.
            healthyAfter: 0,
            backoff: {
                initial: minTimeout / 1000,
                maximum: maxTimeout / 1000,
                jitter: 0,
                ...(backoff.retries !== undefined && Number.isFinite(backoff.retries) ? { retries: backoff.retries } : {}),
            },
        };
        if (options.log) listenerOptions.log = options.log;
        if (options.token) listenerOptions.token = options.token;
        if (options.tls) listenerOptions.tls = options.tls;
        const listener = new Listener([this.url, ...(options.urls ?? [])], listenerOptions);
        this.listener = listener;
        listener.on("open", () => { this.open = true; });
        listener.on("registered", (info) => {
            if (this.#stopped || (info.resumed && options.bootstrapWhenResumed === false)) return;
            for (const entry of info.resources) this.emit("bootstrap", entryOf(entry));
        });
        listener.on("change", (event) => {
            if (this.#stopped) return;
            if (!this.wanted) {
                this.pending.push(event.item);
                return;
            }
            this.wanted = false;
            this.push(event.item);
        });
        listener.on("error", (error) => this.ended(error, false));
        listener.on("fatal", (error) => this.ended(error, true));
        listener.start();
    }

    override _read(): void {
        if (this.pending.length === 0) {
            this.wanted = true;
            return;
        }
        // Not within read(): an item pushed there gets no 'readable' of its own.
        process.nextTick(() => {
            if (!this.#stopped) this.push(this.pending.shift());
        });
    }

    /** Stop for good: close the socket (its `connection-end`, when it was open, is emitted
     * before close() returns: Joyent's tests count it), cancel every reconnection; no event
     * afterwards. */
    close(): void {
        if (this.#stopped) return;
        if (this.open) this.emit("connection-end");
        this.open = false;
        this.#stopped = true;
        const listener = this.listener;
        if (listener) void listener.close();
    }

    /** Joyent's name of close(). */
    _endSocket(): void {
        this.close();
    }

    /** An attempt or a connection ended with `error`; `fatal`: the listener stopped. */
    private ended(error: Error, fatal: boolean): void {
        if (this.#stopped) return;
        const cause = error instanceof RetriesExhausted ? error.lastError : error;
        const wasOpen = this.open;
        this.open = false;
        this.options.log?.warn?.({ error: error.message }, wasOpen ? "cf: connection ended" : "cf: connecting failed");
        // Joyent's reported an item it could not read, then went on.
        if (wasOpen && cause instanceof ProtocolError && !fatal) this.emit("error", cause);
        if (wasOpen) {
            if (cause instanceof ConnectionLost && cause.closeCode === 1006) this.emit("connection-reset");
            this.emit("connection-end");
        }
        if (!fatal || this.#stopped) return;
        // Joyent's backoff 'fail'; a refusal that retrying cannot mend is reported as itself.
        this.emit("error", error instanceof RetriesExhausted ? new Error("Backoff failed") : error);
    }
}

function entryOf(resource: Resource): Resource {
    return { resource: resource.resource, subResources: resource.subResources, bootstrapRoute: resource.bootstrapRoute };
}

export { CompatListener as Listener };

export function createListener(options: CompatOptions): CompatListener {
    return new CompatListener(options);
}
