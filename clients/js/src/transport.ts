/** What the listener needs from the platform: a websocket and HTTP GETs of JSON. The Node
 * build implements it with `ws` and node:http(s), the browser build with WebSocket and fetch. */
import { ConnectionLost } from "./errors.js";

export interface OpenOptions {
    /** `~1` or `~2`. */
    acceptVersion: string;
    token: string | undefined;
    /** Milliseconds the upgrade may take. */
    openTimeout: number;
    /** Aborted by close(): the upgrade is given up at once. */
    signal: AbortSignal;
}

/** An open websocket: its text frames in order, and how it ended. */
export interface Socket {
    send(text: string): void;
    /** The next text frame; rejects with ConnectionLost when the socket closed. */
    next(): Promise<string>;
    close(code?: number, reason?: string): void;
}

export interface Response {
    status: number;
    headers: Record<string, string>;
    body: string;
}

export interface Transport {
    open(url: string, options: OpenOptions): Promise<Socket>;
    get(url: string, token: string | undefined, signal?: AbortSignal): Promise<Response>;
}

/** Frames received and not yet read, with a high-water mark that pauses the socket. */
export class FrameQueue {
    private frames: string[] = [];
    private waiter: { resolve: (frame: string) => void; reject: (error: Error) => void } | null = null;
    private ended: ConnectionLost | null = null;
    private paused = false;

    constructor(
        private readonly highWater: number,
        private readonly pause: () => void,
        private readonly resume: () => void,
    ) {}

    push(frame: string): void {
        if (this.waiter) {
            const waiter = this.waiter;
            this.waiter = null;
            waiter.resolve(frame);
            return;
        }
        this.frames.push(frame);
        if (!this.paused && this.frames.length >= this.highWater) {
            this.paused = true;
            this.pause();
        }
    }

    end(error: ConnectionLost): void {
        if (this.ended) return;
        this.ended = error;
        if (this.waiter) {
            const waiter = this.waiter;
            this.waiter = null;
            waiter.reject(error);
        }
    }

    get length(): number {
        return this.frames.length;
    }

    next(): Promise<string> {
        const frame = this.frames.shift();
        if (frame !== undefined) {
            if (this.paused && this.frames.length <= this.highWater / 2) {
                this.paused = false;
                this.resume();
            }
            return Promise.resolve(frame);
        }
        if (this.ended) return Promise.reject(this.ended);
        return new Promise((resolve, reject) => {
            this.waiter = { resolve, reject };
        });
    }
}
