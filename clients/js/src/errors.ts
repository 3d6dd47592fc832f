/**
 * Every error the listener raises or reports, in one tree:
 *
 *     ChangefeedError
 *     ├── ConnectionLost        the socket closed or could not open (closeCode, reason): retried
 *     ├── ProtocolError         the publisher sent something this client cannot read: retried
 *     ├── HttpError             an HTTP answer other than 2xx (status, code): 5xx/429 retried
 *     │   ├── Unauthorized      401 or 403: credentials missing, wrong or lacking a scope: fatal
 *     │   └── OriginNotAllowed  403: the page's origin is not in the publisher's allowedOrigins: fatal
 *     ├── RegistrationRejected  the publisher refused the registration (closeCode, reason): fatal
 *     ├── RetriesExhausted      the backoff's retries are used up (lastError): fatal
 *     ├── CursorGone            waitFor() on a cursor of another bucket epoch
 *     ├── CursorError           waitFor() on a string that is not a cursor, or a cursor of the other
 *     │                         kind (single/composite) or partition count than the listener's
 *     └── ListenerClosed        close() was called while waiting
 *
 * Retried errors are reported with the `error` event; fatal ones end the listener (`fatal`
 * event, and the async iterator throws them).
 */

export class ChangefeedError extends Error {
    override name = "ChangefeedError";
}

/** The websocket closed (or never opened). `closeCode` 1006 when it ended without a close frame. */
export class ConnectionLost extends ChangefeedError {
    override name = "ConnectionLost";
    constructor(
        readonly url: string,
        readonly closeCode: number,
        readonly reason: string,
    ) {
        super(`connection to ${url} lost: ${closeCode}${reason ? ` ${reason}` : ""}`);
    }
}

export class ProtocolError extends ChangefeedError {
    override name = "ProtocolError";
}

/** An HTTP answer other than 2xx: `status`, and the publisher's error `code` when it sent one. */
export class HttpError extends ChangefeedError {
    override name = "HttpError";
    constructor(
        readonly url: string,
        readonly status: number,
        readonly code: string,
        readonly detail: string,
    ) {
        super(`${url}: HTTP ${status}${code ? ` ${code}` : ""}${detail ? `: ${detail}` : ""}`);
    }
}

/** 401 (no valid credentials) or 403 (a token without the scope). */
export class Unauthorized extends HttpError {
    override name = "Unauthorized";
}

/** 403 `OriginNotAllowed`: the publisher's `allowedOrigins` does not list the page's origin. */
export class OriginNotAllowed extends HttpError {
    override name = "OriginNotAllowed";
}

/** The publisher closed the socket refusing the registration (1008, 1003, 1009...): fatal. */
export class RegistrationRejected extends ChangefeedError {
    override name = "RegistrationRejected";
    constructor(
        readonly url: string,
        readonly closeCode: number,
        readonly reason: string,
    ) {
        super(`registration refused by ${url}: ${closeCode} ${reason}`);
    }
}

export class RetriesExhausted extends ChangefeedError {
    override name = "RetriesExhausted";
    constructor(
        readonly failures: number,
        readonly lastError: Error,
    ) {
        super(`gave up after ${failures} failed attempts; the last: ${lastError.message}`);
    }
}

export class CursorGone extends ChangefeedError {
    override name = "CursorGone";
}

/** A cursor string that could not be decoded (Python's `changefeed.errors.CursorError`). */
export class CursorError extends ChangefeedError {
    override name = "CursorError";
    constructor(
        readonly cursor: string,
        readonly why: string,
    ) {
        super(`invalid cursor ${JSON.stringify(cursor)}: ${why}`);
    }
}

export class ListenerClosed extends ChangefeedError {
    override name = "ListenerClosed";
    constructor() {
        super("the listener was closed");
    }
}

/** True when a failure may go away by itself: try again after a backoff delay. */
export function isRetryable(error: unknown): boolean {
    if (error instanceof Unauthorized) return false;
    if (error instanceof HttpError) return error.status >= 500 || error.status === 429 || error.status === 408;
    return error instanceof ConnectionLost || error instanceof ProtocolError;
}
