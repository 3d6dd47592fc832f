/** The Node transport: `ws` for the websocket, node:http(s) for bootstrap pages, with TLS
 * options, the bearer token as an `Authorization` header, and client pings. */
import * as http from "node:http";
import * as https from "node:https";
import WebSocket from "ws";
import { ConnectionLost } from "../errors.js";
import { httpError } from "../listener.js";
import { FrameQueue, type OpenOptions, type Response, type Socket, type Transport } from "../transport.js";

/** TLS options for an https:// or wss:// publisher (node:tls names). */
export interface TlsOptions {
    ca?: string | Buffer | Array<string | Buffer>;
    cert?: string | Buffer;
    key?: string | Buffer;
    passphrase?: string;
    servername?: string;
    rejectUnauthorized?: boolean;
}

export interface NodeTransportOptions {
    tls?: TlsOptions;
    /** Seconds between the client's pings; a pong must come before the next (0: no pings). */
    pingInterval?: number;
    highWater?: number;
}

export class NodeTransport implements Transport {
    constructor(private readonly options: NodeTransportOptions = {}) {}

    open(url: string, options: OpenOptions): Promise<Socket> {
        const headers: Record<string, string> = { "Accept-Version": options.acceptVersion };
        if (options.token) headers["Authorization"] = `Bearer ${options.token}`;
        const ws = new WebSocket(url, {
            headers, handshakeTimeout: options.openTimeout, perMessageDeflate: false, ...this.options.tls,
        });
        let abort = (): void => undefined;
        return new Promise<Socket>((resolve, reject) => {
            ws.once("unexpected-response", (_request, response) => {
                const chunks: Buffer[] = [];
                response.on("data", (chunk: Buffer) => chunks.push(chunk));
                response.on("end", () => reject(httpError(url, response.statusCode ?? 0, Buffer.concat(chunks).toString())));
                response.on("error", () => reject(httpError(url, response.statusCode ?? 0, "")));
            });
            ws.once("error", (error: Error) => reject(new ConnectionLost(url, 1006, error.message)));
            ws.once("open", () => resolve(new NodeSocket(ws, url, this.options)));
            abort = () => {
                ws.terminate();
                reject(new ConnectionLost(url, 1006, "closed by the listener"));
            };
            if (options.signal.aborted) abort();
            else options.signal.addEventListener("abort", abort, { once: true });
        }).finally(() => options.signal.removeEventListener("abort", abort));
    }

    get(url: string, token: string | undefined, signal?: AbortSignal): Promise<Response> {
        const headers: Record<string, string> = { Accept: "application/json" };
        if (token) headers["Authorization"] = `Bearer ${token}`;
        const client = url.startsWith("https:") ? https : http;
        return new Promise((resolve, reject) => {
            const request = client.get(url, { headers, ...this.options.tls, ...(signal ? { signal } : {}) }, (response) => {
                const chunks: Buffer[] = [];
                response.on("data", (chunk: Buffer) => chunks.push(chunk));
                response.on("end", () => resolve({
                    status: response.statusCode ?? 0,
                    headers: Object.fromEntries(Object.entries(response.headers).map(([k, v]) => [k, String(v)])),
                    body: Buffer.concat(chunks).toString(),
                }));
                response.on("error", (error) => reject(new ConnectionLost(url, 1006, error.message)));
            });
            request.on("error", (error) => reject(new ConnectionLost(url, 1006, error.message)));
        });
    }
}

class NodeSocket implements Socket {
    private readonly queue: FrameQueue;
    private pinger: ReturnType<typeof setInterval> | undefined;

    constructor(private readonly ws: WebSocket, url: string, options: NodeTransportOptions) {
        this.queue = new FrameQueue(options.highWater ?? 1000, () => ws.pause(), () => ws.resume());
        ws.on("message", (data: WebSocket.RawData, isBinary: boolean) => {
            if (!isBinary) this.queue.push(data.toString());
        });
        ws.on("close", (code: number, reason: Buffer) => {
            clearInterval(this.pinger);
            this.queue.end(new ConnectionLost(url, code, reason.toString()));
        });
        ws.on("error", () => undefined); // 'close' follows with 1006
        const interval = (options.pingInterval ?? 20) * 1000;
        if (interval > 0) {
            let answered = true;
            ws.on("pong", () => { answered = true; });
            this.pinger = setInterval(() => {
                if (!answered) {
                    ws.terminate();
                    return;
                }
                answered = false;
                ws.ping();
            }, interval);
            this.pinger.unref?.();
        }
    }

    send(text: string): void {
        this.ws.send(text);
    }

    next(): Promise<string> {
        return this.queue.next();
    }

    close(code = 1000, reason = ""): void {
        clearInterval(this.pinger);
        if (this.ws.readyState === WebSocket.CONNECTING) this.ws.terminate();
        else if (this.ws.readyState === WebSocket.OPEN) {
            this.ws.close(code, reason);
            // A paused socket would never read the close frame back: do not wait for it.
            const timer = setTimeout(() => this.ws.terminate(), 2000);
            timer.unref?.();
        }
    }
}
