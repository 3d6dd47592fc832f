/**
 * The SSE variant for browsers: `GET /changefeeds/sse` over the native EventSource (docs/sse.md):
 * one resource per stream, `registered` / `resync` / `change` / `close` events, `Last-Event-ID`
 * resume on EventSource's own reconnects; the bootstrap walked while changes are buffered, as
 * the websocket Listener does. A token travels as `?access_token=` (EventSource sends no headers).
 */
import { Backoff, type BackoffOptions } from "../backoff.js";
import { Emitter } from "../emitter.js";
import { ListenerClosed, ProtocolError } from "../errors.js";
import { type ChangeEvent, type ListenerEvents, httpError } from "../listener.js";
import { type ChangeItem, type Watch, publisherUrls } from "../protocol.js";
import { BrowserTransport } from "./transport.js";

export interface SseOptions {
    resource: string;
    subResources: string[];
    watch?: Watch;
    since?: string;
    service?: string;
    instance?: string;
    /** A JWT, or a function giving one before every (re)connection: EventSource's own
     * reconnects reuse the URL, so an expired token is replaced when it is refused. */
    token?: string | (() => string | Promise<string>);
    /** False: do not walk the bootstrap route (the page does, on `bootstrapStart`). */
    bootstrap?: boolean;
    pageSize?: number;
    backoff?: BackoffOptions;
}

type Pending = { resumed: boolean; routes: Array<{ resource: string; bootstrapRoute: string }> };

export class SseListener extends Emitter<ListenerEvents> {
    private source: EventSource | null = null;
    private started = false;
    private token: string | undefined;
    private closed = false;
    private cursorValue: string | null;
    private buffer: ChangeItem[] | null = null;
    private readonly base: string;
    private readonly transport = new BrowserTransport("query");
    private readonly backoff: Backoff;
    private delays: Generator<number, void, undefined>;

    constructor(url: string, private readonly options: SseOptions) {
        super();
        this.base = publisherUrls(url)[0];
        this.cursorValue = options.since ?? null;
        this.backoff = new Backoff(options.backoff);
        this.delays = this.backoff.delays();
    }

    get cursor(): string | null {
        return this.cursorValue;
    }

    /** Start listening; after a fatal error (a refused origin or token), start again. */
    start(): this {
        if (!this.started && !this.closed) {
            this.started = true;
            void this.connect();
        }
        return this;
    }

    async close(): Promise<void> {
        if (this.closed) return;
        this.closed = true;
        this.source?.close();
        this.source = null;
        this.emit("close");
    }

    private streamUrl(): string {
        const url = new URL(this.base + "/changefeeds/sse");
        const params = url.searchParams;
        params.set("resource", this.options.resource);
        for (const sub of this.options.subResources) params.append("sub", sub);
        for (const id of this.options.watch?.ids ?? []) params.append("id", id);
        for (const prefix of this.options.watch?.prefixes ?? []) params.append("prefix", prefix);
        if (this.cursorValue) params.set("since", this.cursorValue);
        if (this.options.service) params.set("service", this.options.service);
        if (this.options.instance) params.set("instance", this.options.instance);
        if (this.token) params.set("access_token", this.token);
        return url.toString();
    }

    private async connect(): Promise<void> {
        const given = this.options.token;
        try {
            this.token = typeof given === "function" ? await given() : given;
        } catch (error) {
            this.stop(error as Error);
            return;
        }
        if (this.closed) return;
        const source = new EventSource(this.streamUrl());
        this.source = source;
        let pending: Promise<void> = Promise.resolve();
        // Events are handled one after the other (a bootstrap walk may be in progress).
        const serial = (handler: () => Promise<void> | void) => {
            pending = pending.then(handler).catch((error: Error) => this.failed(error));
        };
        source.addEventListener("registered", (event) => {
            const reply = JSON.parse((event as MessageEvent<string>).data) as {
                bootstrapRoutes: Pending["routes"]; resumed: boolean; cursor: string | null };
            this.delays = this.backoff.delays();
            serial(() => this.registered({ resumed: reply.resumed, routes: reply.bootstrapRoutes }, reply.cursor));
        });
        source.addEventListener("resync", (event) => {
            const { reason } = JSON.parse((event as MessageEvent<string>).data) as { reason: string };
            this.emit("resync", { type: "resync", reason });
        });
        source.addEventListener("change", (event) => {
            const item = JSON.parse((event as MessageEvent<string>).data) as ChangeItem;
            if (this.buffer) this.buffer.push(item);
            else serial(() => this.deliver(item));
        });
        source.addEventListener("close", (event) => {
            const { code, reason } = JSON.parse((event as MessageEvent<string>).data) as { code: number; reason: string };
            this.emit("error", new ProtocolError(`stream closed by the publisher: ${code} ${reason}`));
        });
        source.onerror = () => {
            if (source.readyState !== EventSource.CLOSED || this.closed) return; // EventSource retries
            serial(() => this.refused());
        };
    }

    private async registered(reply: Pending, cursor: string | null): Promise<void> {
        this.emit("registered", { url: this.base, resumed: reply.resumed, cursor, resources: [], coalesce: false });
        if (reply.resumed) return;
        const route = reply.routes.find((r) => r.resource === this.options.resource);
        if (!route) throw new ProtocolError(`registered without a route for ${this.options.resource}`);
        this.buffer = [];
        this.emit("bootstrapStart", { type: "bootstrapStart", resource: route.resource });
        if (this.options.bootstrap !== false) {
            let url: string | null = new URL(route.bootstrapRoute, this.base + "/").toString();
            const first = new URL(url);
            first.searchParams.set("limit", String(this.options.pageSize ?? 100));
            for (const id of this.options.watch?.ids ?? []) first.searchParams.append("id", id);
            for (const prefix of this.options.watch?.prefixes ?? []) first.searchParams.append("prefix", prefix);
            url = first.toString();
            while (url && !this.closed) {
                const response = await this.transport.get(url, this.token);
                if (response.status !== 200) throw httpError(url, response.status, response.body);
                const page = JSON.parse(response.body) as { items: unknown[]; next: string | null };
                this.emit("bootstrapRecords", { type: "bootstrapRecords", resource: route.resource, objects: page.items });
                url = page.next ? new URL(page.next, url).toString() : null;
            }
        }
        this.cursorValue = cursor;
        this.emit("bootstrapDone", { type: "bootstrapDone", resource: route.resource, cursor });
        const buffered = this.buffer;
        this.buffer = null;
        for (const item of buffered) await this.deliver(item);
    }

    private async deliver(item: ChangeItem): Promise<void> {
        const event: ChangeEvent = {
            type: "change", item, resource: item.changeKind.resource, id: item.changedResourceId,
            subResources: item.changeKind.subResources, cursor: item.cursor ?? "",
            coalesced: item.coalesced === true, caughtUp: item.caughtUp === true,
        };
        this.emit("change", event);
        if (item.cursor && (item.caughtUp || !item.coalesced)) this.cursorValue = item.cursor;
    }

    /** EventSource gave up (an HTTP error, or the publisher unreachable): why, then retry or stop
     * until start() is called again. */
    private async refused(): Promise<void> {
        this.source = null;
        const refusal = await this.transport.refusal(this.base + "/changefeeds", this.token);
        const renewable = typeof this.options.token === "function" && refusal?.status === 401;
        if (refusal && !renewable) {
            this.stop(refusal);
            return;
        }
        const next = this.delays.next();
        if (next.done) {
            this.stop(new ListenerClosed());
            return;
        }
        this.emit("error", new ProtocolError("the event stream failed; reconnecting"));
        setTimeout(() => { if (this.started && !this.closed) void this.connect(); }, next.value * 1000);
    }

    /** A failure retrying cannot mend: report it, and wait for start(). */
    private stop(error: Error): void {
        this.started = false;
        this.delays = this.backoff.delays();
        this.emit("fatal", error);
        this.emit("close");
    }

    private failed(error: Error): void {
        this.emit("error", error);
    }
}
