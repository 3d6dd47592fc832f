// The Joyent drop-in (require("changefeed-listener/compat")) with Joyent's option and event
// shapes, from the CommonJS build, against real publishers. The events expected are those of
// Joyent's lib/listener.js (changefeed 1.5.4) over watershed 0.4: `bootstrap` per resource of a
// registration reply; `readable`; on the websocket's end `connection-reset` when no close frame
// came (watershed's connectionReset), then `connection-end`; a failed connection attempt (its
// `GET /changefeeds`) only logged; `error` `Backoff failed` when backoff.retries are spent.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { after, before, test } from "node:test";
import { Fixture, sleep } from "./harness.mjs";

const require = createRequire(import.meta.url);
const changefeed = require("../dist/cjs/compat/index.js");

let fixture;
before(async () => { fixture = await Fixture.start(); });
after(async () => { await fixture?.close(); });

/** A bunyan-shaped logger that keeps its records. */
function logger() {
    const records = [];
    const log = {};
    for (const level of ["trace", "debug", "info", "warn", "error"]) {
        log[level] = (fields, message) => records.push({ level, fields, message });
    }
    log.records = records;
    return log;
}

/** Joyent's listen.js, as a recorder: bootstrap / change / error / connection-end. */
function record(listener) {
    const events = [];
    const wakeups = new Set();
    const add = (event) => { events.push(event); for (const wake of wakeups) wake(); };
    listener.on("bootstrap", (entry) => add({ event: "bootstrap", data: entry }));
    listener.on("readable", () => {
        let item;
        while ((item = listener.read()) !== null) add({ event: "change", data: item });
    });
    listener.on("error", (error) => add({ event: "error", message: error.message }));
    listener.on("connection-end", () => add({ event: "connection-end" }));
    listener.on("connection-reset", () => add({ event: "connection-reset" }));
    events.until = (predicate, what, seconds = 20) => new Promise((resolve, reject) => {
        const check = () => { if (predicate(events)) { clearTimeout(timer); wakeups.delete(check); resolve(); } };
        const timer = setTimeout(() => { wakeups.delete(check); reject(new Error(`timed out: ${what}: ${JSON.stringify(events.map((e) => e.event))}`)); }, seconds * 1000);
        wakeups.add(check);
        check();
    });
    events.of = (kind) => events.filter((e) => e.event === kind);
    /** The event names, a change's as "change". */
    events.names = () => events.map((e) => e.event);
    return events;
}

const cursorsOf = (events) => events.of("change").map((e) => e.data.cursor);

test("v1 (changeKind, endpoint + port): Joyent's events across a publisher's restart, plus the changes of the gap", async () => {
    const publisher = await fixture.publisher({}, true);
    const port = Number(new URL(publisher.url).port);
    const listener = changefeed.createListener({
        log: logger(), endpoint: "127.0.0.1", port, instance: "compat-v1", service: "compat",
        changeKind: { resource: "vm", subResources: ["nic"] },
        backoff: { minTimeout: 50, maxTimeout: 300, retries: Infinity },
    });
    const events = record(listener);
    listener.register();
    try {
        await events.until((e) => e.of("bootstrap").length === 1, "bootstrap");
        assert.deepEqual(events[0].data, { resource: "vm", subResources: ["nic", "alias", "state"], bootstrapRoute: "/vms" });
        const before = await fixture.commit(["vm", "a", ["nic"]], ["vm", "b", ["alias"]], ["vm", "c", ["nic"]]);
        await events.until((e) => cursorsOf(e).includes(before[2]), "the first changes");
        const item = events.of("change")[0].data;
        assert.deepEqual(Object.keys(item).sort(), ["changeKind", "changedResourceId", "cursor", "published"]);
        await fixture.call({ op: "kill", id: publisher.id });
        const during = await fixture.commit(["vm", "d", ["nic"]]);
        await fixture.call({ op: "start", id: publisher.id });
        const later = await fixture.commit(["vm", "e", ["nic"]]);
        await events.until((e) => cursorsOf(e).includes(later[0]), "the changes after the restart");
        assert.deepEqual(cursorsOf(events), [before[0], before[2], ...during, ...later]);
        // Joyent's events (a bootstrap at every registration); what resuming adds is the change
        // committed while the publisher was down.
        assert.deepEqual(events.names(), ["bootstrap", "change", "change", "connection-reset", "connection-end",
            "bootstrap", "change", "change"]);
        assert.ok(listener.cursor === later[0]);
    } finally {
        listener.close();
    }
});

test("v2 (resources): one bootstrap per resource; a reconnect that cannot resume bootstraps again", async () => {
    const { url } = await fixture.publisher();
    const listener = changefeed.createListener({
        log: logger(), url, instance: "compat-v2", service: "compat",
        resources: [{ resource: "vm", subResources: ["state"] }, { resource: "network", subResources: ["*"] }],
        backoff: { minTimeout: 50, maxTimeout: 300 },
    });
    const events = record(listener);
    listener.register();
    try {
        await events.until((e) => e.of("bootstrap").length === 2, "bootstrap");
        assert.deepEqual(events.of("bootstrap").map((e) => e.data.resource), ["vm", "network"]);
        const [first] = await fixture.commit(["network", "n-1", ["ips"]]);
        await events.until((e) => cursorsOf(e).includes(first), "a change");
        await fixture.call({ op: "flush" }); // the bucket recreated: 4009, resumed: false
        await fixture.commit(["vm", "x", ["state"]]);
        await events.until((e) => e.of("bootstrap").length === 4, "bootstrap again", 30);
        // 4009 is a close frame: an end, not a reset; no error.
        assert.deepEqual(events.names(), ["bootstrap", "bootstrap", "change", "connection-end", "bootstrap", "bootstrap"]);
    } finally {
        listener.close();
    }
});

test("close() on Node 20 stops every reconnection (Joyent's bug: `this.closed = true` ignored)", async () => {
    assert.ok(process.versions.node.split(".")[0] >= 20);
    const publisher = await fixture.publisher({}, true);
    const log = logger();
    const listener = changefeed.createListener({
        log, url: publisher.url, instance: "compat-close", service: "compat",
        changeKind: { resource: "vm", subResources: ["nic"] },
        backoff: { minTimeout: 20, maxTimeout: 20, retries: 3 },
    });
    const events = record(listener);
    listener.register();
    await events.until((e) => e.of("bootstrap").length === 1, "bootstrap");
    await fixture.call({ op: "kill", id: publisher.id });
    await events.until((e) => e.of("connection-end").length === 1, "connection-end");
    listener.close();
    const seen = events.length;
    const connecting = log.records.filter((r) => r.message === "connecting").length;
    await fixture.call({ op: "start", id: publisher.id });
    await sleep(500); // 25 backoff delays: Joyent's kept reconnecting, then emitted 'Backoff failed'
    assert.equal(events.length, seen, JSON.stringify(events.slice(seen)));
    assert.equal(log.records.filter((r) => r.message === "connecting").length, connecting);
    assert.ok(!events.some((e) => e.event === "error" && /gave up|Backoff failed/.test(e.message)));
});

test("close() while connected: its connection-end before close() returns, nothing at all afterwards", async () => {
    const publisher = await fixture.publisher();
    const listener = changefeed.createListener({
        log: logger(), url: publisher.url, instance: "compat-close-open", service: "compat",
        changeKind: { resource: "vm", subResources: ["nic"] }, backoff: { minTimeout: 20, maxTimeout: 20, retries: 1 },
    });
    const events = record(listener);
    listener.register();
    await events.until((e) => e.of("bootstrap").length === 1, "bootstrap");
    // Joyent's own listener test counts this connection-end, in a handler of the items read
    // before close().
    listener.close();
    assert.deepEqual(events.names(), ["bootstrap", "connection-end"]);
    listener.close();
    await fixture.commit(["vm", "after-close", ["nic"]]);
    await fixture.call({ op: "kill", id: publisher.id });
    await sleep(300); // what Joyent's would have emitted by now: connection-end, Backoff failed
    assert.deepEqual(events.names(), ["bootstrap", "connection-end"]);
});

test("backoff.retries spent: connection-reset, connection-end, then one error 'Backoff failed', then nothing", async () => {
    const publisher = await fixture.publisher();
    const log = logger();
    const listener = changefeed.createListener({
        log, url: publisher.url, instance: "compat-retries", service: "compat",
        changeKind: { resource: "vm", subResources: ["nic"] },
        backoff: { minTimeout: 20, maxTimeout: 40, retries: 2 },
    });
    const events = record(listener);
    const errors = [];
    listener.on("error", (error) => errors.push(error));
    listener.register();
    try {
        await events.until((e) => e.of("bootstrap").length === 1, "bootstrap");
        await fixture.call({ op: "kill", id: publisher.id });
        await events.until((e) => e.of("error").length === 1, "Backoff failed");
        assert.deepEqual(events.names(), ["bootstrap", "connection-reset", "connection-end", "error"]);
        assert.equal(errors[0].constructor, Error);
        assert.equal(errors[0].message, "Backoff failed");
        // The end, then two retries (Joyent's failAfter(2)), each only logged.
        assert.equal(log.records.filter((r) => r.message === "connecting").length, 3);
        await fixture.call({ op: "start", id: publisher.id });
        await sleep(300); // 7 backoff delays: nothing reconnects after Backoff failed
        assert.equal(events.length, 4, JSON.stringify(events.slice(4)));
        assert.equal(log.records.filter((r) => r.message === "connecting").length, 3);
    } finally {
        listener.close();
    }
});

test("a publisher that stops: its close frame (1001) is a connection-end without connection-reset; bootstrapWhenResumed: false", async () => {
    const publisher = await fixture.publisher({}, true);
    const listener = changefeed.createListener({
        log: logger(), url: publisher.url, instance: "compat-stop", service: "compat",
        changeKind: { resource: "vm", subResources: ["nic"] }, backoff: { minTimeout: 20, maxTimeout: 100 },
        bootstrapWhenResumed: false,
    });
    const events = record(listener);
    listener.register();
    try {
        await events.until((e) => e.of("bootstrap").length === 1, "bootstrap");
        await fixture.call({ op: "stop", id: publisher.id });
        await events.until((e) => e.of("connection-end").length === 1, "connection-end");
        await fixture.call({ op: "start", id: publisher.id });
        const [cursor] = await fixture.commit(["vm", "after-stop", ["nic"]]);
        await events.until((e) => cursorsOf(e).includes(cursor), "the change after the restart");
        // The stop's close frame: an end without a reset. (A reconnection may reach the stopping
        // publisher before it stops listening: its own end follows.)
        assert.deepEqual(events.names().slice(0, 2), ["bootstrap", "connection-end"]);
        assert.deepEqual(events.names().filter((name) => name !== "connection-end" && name !== "connection-reset"),
            ["bootstrap", "change"]);
    } finally {
        listener.close();
    }
});

test("a refused registration (1008) ends the connection and is one error; register() tries again", async () => {
    const { url } = await fixture.publisher();
    const log = logger();
    const listener = changefeed.createListener({
        log, url, instance: "compat-refused", service: "compat",
        changeKind: { resource: "disk", subResources: ["size"] }, backoff: { minTimeout: 20, maxTimeout: 20 },
    });
    const events = record(listener);
    const errors = [];
    listener.on("error", (error) => errors.push(error));
    listener.register();
    try {
        await events.until((e) => e.of("error").length === 1, "the refusal");
        await sleep(200); // retrying would have made 10 attempts by now
        assert.deepEqual(events.names(), ["connection-end", "error"]);
        assert.equal(errors[0].name, "RegistrationRejected");
        assert.equal(errors[0].closeCode, 1008);
        assert.match(errors[0].message, /disk/);
        assert.equal(log.records.filter((r) => r.message === "connecting").length, 1);
        listener.register();
        await events.until((e) => e.of("error").length === 2, "the refusal again");
        assert.deepEqual(events.names(), ["connection-end", "error", "connection-end", "error"]);
    } finally {
        listener.close();
    }
});

test("one read() per 'readable' (Joyent's tests) reads every item, even items that came in one chunk", async () => {
    const { url } = await fixture.publisher();
    const listener = changefeed.createListener({
        log: logger(), url, instance: "compat-readable", service: "compat",
        changeKind: { resource: "vm", subResources: ["nic"] },
    });
    const read = [];
    let bootstrapped;
    const bootstrap = new Promise((resolve) => { bootstrapped = resolve; });
    let wake = () => undefined;
    listener.on("bootstrap", () => bootstrapped());
    listener.on("readable", () => {
        const item = listener.read();
        if (item !== null) read.push(item.cursor);
        wake();
    });
    listener.register();
    try {
        await bootstrap;
        const cursors = await fixture.commit(...Array.from({ length: 20 }, (_, i) => ["vm", `r${i}`, ["nic"]]));
        await new Promise((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`read ${read.length} of 20`)), 20000);
            wake = () => { if (read.length === 20) { clearTimeout(timer); resolve(); } };
            wake();
        });
        assert.deepEqual(read, cursors);
    } finally {
        listener.close();
    }
});

test("Joyent's option checks: changeKind or resources, instance and service", () => {
    assert.throws(() => changefeed.createListener({ url: "http://x", service: "s", changeKind: { resource: "vm", subResources: [] } }), /instance/);
    assert.throws(() => changefeed.createListener({ url: "http://x", instance: "i", service: "s" }), /changeKind/);
    assert.throws(() => changefeed.createListener({ instance: "i", service: "s", changeKind: { resource: "vm", subResources: ["*"] } }), /url/);
    const both = { url: "http://x", instance: "i", service: "s", changeKind: { resource: "vm", subResources: ["*"] }, resources: [{ resource: "vm", subResources: ["*"] }] };
    assert.throws(() => changefeed.createListener(both), /exclude/);
    assert.equal(typeof changefeed.Listener, "function");
});
