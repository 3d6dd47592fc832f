/**
 * changefeed-listener for browsers: an ES module over the native WebSocket (`Listener`) and
 * EventSource (`SseListener`), with nothing to install.
 *
 * ```js
 * import { Listener } from "/js/changefeed-listener/browser/index.js";
 * const feed = new Listener("https://feed.example.com", {instance: crypto.randomUUID(),
 *     service: "dashboard", resources: {vm: ["*"]}, token: await fetchJwt()});
 * for await (const event of feed) render(event);
 * ```
 */
import { BaseListener, type ListenerOptions } from "../listener.js";
import { BrowserTransport, type TokenCarrier } from "./transport.js";

export interface BrowserListenerOptions extends ListenerOptions {
    /** How the token reaches the upgrade: a subprotocol (the default) or `?access_token=`. */
    tokenCarrier?: TokenCarrier;
}

export class Listener extends BaseListener {
    constructor(urls: string | readonly string[], options: BrowserListenerOptions) {
        super(new BrowserTransport(options.tokenCarrier ?? "subprotocol"), urls, options);
    }
}

export { SseListener, type SseOptions } from "./sse.js";
export { Backoff, type BackoffOptions } from "../backoff.js";
export {
    ChangefeedError, ConnectionLost, CursorError, CursorGone, HttpError, ListenerClosed, OriginNotAllowed,
    ProtocolError, RegistrationRejected, RetriesExhausted, Unauthorized,
} from "../errors.js";
export type { ChangeEvent, ListenerEvent, ListenerEvents, ListenerOptions, Registered } from "../listener.js";
export { CloseCode, type ChangeItem, type Resource, type Watch } from "../protocol.js";
