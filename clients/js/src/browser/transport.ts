/** The browser transport: the native WebSocket and fetch. A page cannot set headers on an
 * upgrade, so the registration version travels as `?accept_version=` and a token as the
 * `changefeed.bearer.<token>` subprotocol (or `?access_token=`); bootstrap pages are fetched
 * with an `Authorization` header. */
import { ConnectionLost, type HttpError, OriginNotAllowed } from "../errors.js";
import { httpError } from "../listener.js";
import { BEARER_SUBPROTOCOL, SUBPROTOCOL } from "../protocol.js";
import { FrameQueue, type OpenOptions, type Response, type Socket, type Transport } from "../transport.js";

export type TokenCarrier = "subprotocol" | "query";

export class BrowserTransport implements Transport {
    constructor(private readonly carrier: TokenCarrier = "subprotocol") {}

    async open(url: string, options: OpenOptions): Promise<Socket> {
        const target = new URL(url);
        target.searchParams.set("accept_version", options.acceptVersion);
        let protocols: string[] = [];
        if (options.token && this.carrier === "query") target.searchParams.set("access_token", options.token);
        else if (options.token) protocols = [SUBPROTOCOL, BEARER_SUBPROTOCOL + options.token];
        const ws = new WebSocket(target.toString(), protocols);
        try {
            return await opened(ws, url, options.openTimeout, options.signal);
        } catch (error) {
            if (options.signal.aborted) throw error;
            throw await this.refusal(url.replace(/^ws/, "http"), options.token) ?? error;
        }
    }

    /**
     * Why the publisher refuses this page, when that is why a connection failed: a browser shows
     * a page only `1006` for a refused upgrade or EventSource. `probe` (the publisher's
     * `/changefeeds`) is asked by fetch: an answer the page may not read (CORS) while the publisher did answer
     * means its `allowedOrigins` lacks the page's origin (it lets allowed origins read every
     * answer, refusals included); a readable 401 or 403 with the token is the token's refusal.
     * Null: no refusal (the publisher is unreachable, or it may pass), retry.
     */
    async refusal(probe: string, token: string | undefined): Promise<HttpError | null> {
        let answer: Response;
        try {
            answer = await this.get(probe, token);
        } catch {
            // fetch fails alike for CORS and for the network; without CORS (an opaque answer)
            // it fails only for the network.
            const answered = await fetch(probe, { mode: "no-cors" }).then(() => true, () => false);
            if (!answered) return null;
            return new OriginNotAllowed(probe, 403, "OriginNotAllowed",
                `the publisher answered but lets no page of origin ${location.origin} read it: `
                + "its allowedOrigins must list that origin");
        }
        return answer.status === 401 || answer.status === 403 ? httpError(probe, answer.status, answer.body) : null;
    }

    async get(url: string, token: string | undefined, signal?: AbortSignal): Promise<Response> {
        const headers: Record<string, string> = { Accept: "application/json" };
        if (token) headers["Authorization"] = `Bearer ${token}`;
        let response: globalThis.Response;
        try {
            response = await fetch(url, signal ? { headers, signal } : { headers });
        } catch (error) {
            throw new ConnectionLost(url, 1006, (error as Error).message);
        }
        const collected: Record<string, string> = {};
        response.headers.forEach((value, key) => { collected[key] = value; });
        return { status: response.status, headers: collected, body: await response.text() };
    }
}

function opened(ws: WebSocket, url: string, timeout: number, signal: AbortSignal): Promise<Socket> {
    return new Promise((resolve, reject) => {
        signal.addEventListener("abort", () => ws.close(), { once: true });
        const timer = setTimeout(() => {
            ws.close();
            reject(new ConnectionLost(url, 1006, "upgrade timed out"));
        }, timeout);
        ws.onopen = () => {
            clearTimeout(timer);
            resolve(new BrowserSocket(ws, url));
        };
        ws.onclose = (event) => {
            clearTimeout(timer);
            reject(new ConnectionLost(url, event.code || 1006, event.reason));
        };
    });
}

class BrowserSocket implements Socket {
    // A browser reads every frame as it comes: nothing to pause.
    private readonly queue = new FrameQueue(Number.POSITIVE_INFINITY, () => undefined, () => undefined);

    constructor(private readonly ws: WebSocket, url: string) {
        ws.onmessage = (event) => {
            if (typeof event.data === "string") this.queue.push(event.data);
        };
        ws.onclose = (event) => this.queue.end(new ConnectionLost(url, event.code || 1006, event.reason));
    }

    send(text: string): void {
        this.ws.send(text);
    }

    next(): Promise<string> {
        return this.queue.next();
    }

    close(code = 1000, reason = ""): void {
        if (this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING) {
            this.ws.close(code, reason);
        }
    }
}
