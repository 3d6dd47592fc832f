// Real servers for the tests: test/fixture.py (a private redis-server and `changefeed serve`
// publishers, from the project's venv) driven over its standard input.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
export const REPO = join(here, "..", "..", "..");
export const FACTOR = Number(process.env.CHANGEFEED_TEST_TIMEOUT_FACTOR ?? "1");

export function python() {
    const python = process.env.CHANGEFEED_PYTHON ?? join(REPO, ".venv", "bin", "python");
    if (!existsSync(python)) {
        throw new Error(`${python} not found: the tests run the publisher from the project's venv `
            + "(python3 -m venv .venv && .venv/bin/pip install -e '.[test]'), or set CHANGEFEED_PYTHON");
    }
    return python;
}

export class Fixture {
    static async start() {
        const fixture = new Fixture();
        await fixture.ready;
        return fixture;
    }

    constructor() {
        this.stderr = "";
        this.child = spawn(python(), [join(here, "fixture.py")], {
            cwd: REPO, stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, PYTHONPATH: REPO },
        });
        this.child.stderr.on("data", (chunk) => { this.stderr += chunk; });
        this.answers = [];
        this.waiting = [];
        createInterface({ input: this.child.stdout }).on("line", (line) => {
            const answer = JSON.parse(line);
            const waiter = this.waiting.shift();
            if (waiter) waiter.resolve(answer); else this.answers.push(answer);
        });
        this.ready = this.answer().then((answer) => { this.redis = answer.ok.redis; });
        this.exited = new Promise((resolve) => this.child.once("exit", () => {
            this.dead = true;
            for (const waiter of this.waiting.splice(0)) waiter.reject(new Error(`fixture exited:\n${this.stderr}`));
            resolve();
        }));
    }

    answer() {
        const queued = this.answers.shift();
        if (queued) return Promise.resolve(queued);
        if (this.dead) return Promise.reject(new Error(`fixture exited:\n${this.stderr}`));
        return new Promise((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`fixture silent:\n${this.stderr}`)), 60000 * FACTOR);
            this.waiting.push({
                resolve: (answer) => { clearTimeout(timer); resolve(answer); },
                reject: (error) => { clearTimeout(timer); reject(error); },
            });
        });
    }

    async call(command) {
        this.child.stdin.write(JSON.stringify(command) + "\n");
        const answer = await this.answer();
        if ("error" in answer) throw new Error(`fixture ${command.op}: ${answer.error}`);
        return answer.ok;
    }

    publisher(config = {}, fixedPort = false) {
        return this.call({ op: "publisher", config, fixedPort });
    }

    /** Commit changes: [resource, id, subs, state?] each; their cursors. */
    commit(...changes) {
        return this.commitTo("default", ...changes);
    }

    /** A publisher on a bucket of `partitions` partitions in a 3-master Redis Cluster: {id, url}. */
    cluster(partitions) {
        return this.call({ op: "cluster", partitions });
    }

    /** Commit to "default" (the redis-server's bucket) or "cluster": the cursors. */
    commitTo(bucket, ...changes) {
        return this.call({ op: "commit", bucket, changes: changes.map(([r, id, subs, state, del]) => [r, id, subs, state ?? { id }, del ?? false]) });
    }

    async close() {
        this.child.stdin.end();
        await this.exited;
    }
}

/** Collects a listener's events (events style) for assertions. */
export class Recorder {
    constructor(listener) {
        this.events = [];
        this.errors = [];
        this.fatal = null;
        this.registered = [];
        this.wakeups = new Set();
        for (const type of ["resync", "bootstrapStart", "bootstrapRecords", "bootstrapDone", "change"]) {
            listener.on(type, (event) => this.add(event));
        }
        listener.on("registered", (info) => { this.registered.push(info); this.wake(); });
        listener.on("error", (error) => { this.errors.push(error); this.wake(); });
        listener.on("fatal", (error) => { this.fatal = error; this.wake(); });
    }

    add(event) {
        this.events.push(event);
        this.wake();
    }

    wake() {
        for (const wake of this.wakeups) wake();
    }

    of(type) {
        return this.events.filter((event) => event.type === type);
    }

    changes() {
        return this.of("change").map((event) => event.cursor);
    }

    /** Resolves when `predicate()` holds (checked after every event), or fails after `seconds`. */
    until(predicate, what, seconds = 20) {
        return new Promise((resolve, reject) => {
            const check = () => {
                let held;
                try { held = predicate(); } catch (error) { done(); reject(error); return; }
                if (held) { done(); resolve(); }
            };
            const timer = setTimeout(() => {
                done();
                reject(new Error(`timed out waiting until ${what}; events: ${JSON.stringify(this.events.map((e) => e.type))}, `
                    + `errors: ${this.errors.map((e) => e.message).join("; ")}`));
            }, seconds * 1000 * FACTOR);
            const done = () => { clearTimeout(timer); this.wakeups.delete(check); };
            this.wakeups.add(check);
            check();
        });
    }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
export const FAST = { initial: 0.05, maximum: 0.3 };
