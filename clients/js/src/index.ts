/**
 * changefeed-listener for Node 20+: a Listener of RFD 5 change feeds that resumes by cursor.
 *
 * ```js
 * import { Listener } from "changefeed-listener";
 * const feed = new Listener("http://127.0.0.1:8080", {instance: "uuid", service: "tcns",
 *                                                    resources: {vm: ["nic", "alias"]}});
 * for await (const event of feed) { ... }   // bootstrap pages first, then live changes
 * ```
 */
import { BaseListener, type ListenerOptions } from "./listener.js";
import { NodeTransport, type TlsOptions } from "./node/transport.js";

export interface NodeListenerOptions extends ListenerOptions {
    /** TLS options for https:// publishers (ca, cert, key, rejectUnauthorized...). */
    tls?: TlsOptions;
    /** Seconds between the client's pings (a dead publisher is dropped after two); 0: none. */
    pingInterval?: number;
}

export class Listener extends BaseListener {
    constructor(urls: string | readonly string[], options: NodeListenerOptions) {
        const transport: { tls?: TlsOptions; pingInterval?: number; highWater?: number } = {};
        if (options.tls) transport.tls = options.tls;
        if (options.pingInterval !== undefined) transport.pingInterval = options.pingInterval;
        if (options.highWater !== undefined) transport.highWater = options.highWater;
        super(new NodeTransport(transport), urls, options);
    }
}

export { Backoff, type BackoffOptions } from "./backoff.js";
export {
    ChangefeedError, ConnectionLost, CursorError, CursorGone, HttpError, ListenerClosed, OriginNotAllowed,
    ProtocolError, RegistrationRejected, RetriesExhausted, Unauthorized, isRetryable,
} from "./errors.js";
export type {
    ChangeEvent, ListenerEvent, ListenerEvents, ListenerOptions, Logger, Registered,
} from "./listener.js";
export { CloseCode, type ChangeItem, type Resource, type Watch } from "./protocol.js";
export type { TlsOptions } from "./node/transport.js";
