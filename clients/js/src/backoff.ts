/**
 * Exponential backoff with jitter, as a pure generator of delays (as changefeed/backoff.py):
 * delays start at `initial` seconds, grow by `factor` up to `maximum`, each drawn uniformly
 * from [delay * (1 - jitter), delay]; `retries` bounds their number (undefined: for ever).
 */
export interface BackoffOptions {
    initial?: number;
    maximum?: number;
    factor?: number;
    jitter?: number;
    retries?: number;
}

export class Backoff {
    readonly initial: number;
    readonly maximum: number;
    readonly factor: number;
    readonly jitter: number;
    readonly retries: number | undefined;

    constructor(options: BackoffOptions = {}) {
        this.initial = options.initial ?? 0.1;
        this.maximum = options.maximum ?? 30;
        this.factor = options.factor ?? 2;
        this.jitter = options.jitter ?? 0.5;
        this.retries = options.retries;
        if (!(this.initial > 0) || !(this.maximum >= this.initial)) {
            throw new RangeError("backoff needs 0 < initial <= maximum");
        }
        if (!(this.factor >= 1)) throw new RangeError("backoff factor must be >= 1");
        if (!(this.jitter >= 0 && this.jitter <= 1)) throw new RangeError("backoff jitter must be within [0, 1]");
        if (this.retries !== undefined && !(this.retries >= 0)) {
            throw new RangeError("backoff retries must be >= 0 (or undefined: for ever)");
        }
    }

    /** The delays, in seconds, before each retry. */
    *delays(random: () => number = Math.random): Generator<number, void, undefined> {
        let delay = this.initial;
        for (let attempt = 0; this.retries === undefined || attempt < this.retries; attempt++) {
            yield delay * (1 - this.jitter * random());
            delay = Math.min(delay * this.factor, this.maximum);
        }
    }
}
