// The Node Listener against real publishers (test/fixture.py): bootstrap while buffering,
// kill and restart, a second URL, 4008, 4009, refusals, close(), waitFor().
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { ConnectionLost, Listener, RegistrationRejected, Unauthorized } from "../dist/esm/index.js";
import { FAST, Fixture, Recorder, sleep } from "./harness.mjs";

let fixture;
before(async () => { fixture = await Fixture.start(); });
after(async () => { await fixture?.close(); });

test("bootstraps every page while buffering live changes, then delivers them in order", async () => {
    const { url } = await fixture.publisher();
    const initial = [];
    for (let n = 0; n < 25; n++) initial.push(["vm", `boot-${String(n).padStart(2, "0")}`, ["nic"]]);
    await fixture.commit(...initial);
    const feed = new Listener(url, { instance: "i-boot", service: "js", resources: { vm: ["nic"] }, pageSize: 10, backoff: FAST });
    const seen = [];
    let live = [];
    const committing = [];
    try {
        for await (const event of feed) {
            seen.push(event);
            if (event.type === "bootstrapRecords" && committing.length === 0) {
                // Changes committed while the bootstrap is walked: buffered, delivered after it.
                committing.push(fixture.commit(["vm", "late-1", ["nic"]], ["vm", "late-2", ["alias"]], ["vm", "late-3", ["nic", "state"]]));
                live = await committing[0];
            }
            if (event.type === "change" && event.cursor === live[2]) break;
        }
    } finally {
        await feed.close();
    }
    const types = seen.map((event) => event.type);
    assert.equal(types[0], "bootstrapStart");
    assert.equal(types.filter((t) => t === "bootstrapRecords").length, 3); // 10, 10, then 5 and no next
    const objects = seen.filter((e) => e.type === "bootstrapRecords").flatMap((e) => e.objects.map((o) => o.id));
    assert.ok(objects.length >= 25 && objects.includes("boot-24"));
    const done = seen.find((e) => e.type === "bootstrapDone");
    assert.match(done.cursor, /\./);
    // The changes committed during the bootstrap were buffered: handed over after it, in order.
    assert.ok(types.indexOf("change") > types.indexOf("bootstrapDone"));
    const changes = seen.filter((e) => e.type === "change");
    assert.deepEqual(changes.map((e) => [e.id, e.cursor]).filter(([id]) => id.startsWith("late")),
        [["late-1", live[0]], ["late-3", live[2]]]);
});

const vm = (n, prefix = "vm") => ["vm", `${prefix}-${n}`, ["nic"]];
const range = (count, make) => Array.from({ length: count }, (_, n) => make(n));

test("a publisher SIGKILLed and restarted: every change delivered exactly once, in order", async () => {
    const publisher = await fixture.publisher({}, true);
    const feed = new Listener(publisher.url, { instance: "i-kill", service: "js", resources: { vm: ["nic"] }, backoff: FAST });
    const record = new Recorder(feed);
    feed.start();
    try {
        await record.until(() => record.of("bootstrapDone").length === 1, "bootstrapped");
        const before = await fixture.commit(...range(10, (n) => vm(n, "a")));
        await record.until(() => record.changes().includes(before.at(-1)), "the first changes");
        await fixture.call({ op: "kill", id: publisher.id });
        const during = await fixture.commit(...range(10, (n) => vm(n, "b")));
        await fixture.call({ op: "start", id: publisher.id });
        const afterwards = await fixture.commit(...range(10, (n) => vm(n, "c")));
        await record.until(() => record.changes().includes(afterwards.at(-1)), "the changes after the restart");
        assert.deepEqual(record.changes(), [...before, ...during, ...afterwards]);
        assert.equal(record.of("bootstrapStart").length, 1);
        assert.equal(record.of("resync").length, 0);
        assert.ok(record.registered.length >= 2 && record.registered.at(-1).resumed);
        assert.ok(record.errors.every((error) => error instanceof ConnectionLost));
    } finally {
        await feed.close();
    }
});

test("moves to the second publisher URL when the first stops, and resumes there", async () => {
    const one = await fixture.publisher();
    const two = await fixture.publisher();
    const feed = new Listener([one.url, two.url], { instance: "i-two", service: "js", resources: { vm: ["nic"], network: ["*"] }, backoff: FAST });
    const record = new Recorder(feed);
    feed.start();
    try {
        await record.until(() => record.of("bootstrapDone").length === 2, "both resources bootstrapped");
        const [first] = await fixture.commit(vm(1, "x"));
        await record.until(() => record.changes().includes(first), "the first change");
        await fixture.call({ op: "stop", id: one.id }); // 1001 to its listeners
        const [second, third] = await fixture.commit(["network", "n-1", ["ips"]], vm(2, "x"));
        await record.until(() => record.changes().includes(third), "the changes on the second publisher");
        assert.equal(feed.url, two.url);
        assert.deepEqual(record.changes(), [first, second, third]);
        assert.deepEqual(record.errors.map((error) => error.closeCode), [1001]);
        assert.equal(record.of("bootstrapStart").length, 2);
    } finally {
        await feed.close();
    }
});

test("4008 (a slow consumer: the socket paused by its high-water mark) resumes without loss", async () => {
    const { url } = await fixture.publisher({ limits: { window: 50, sendBuffer: 4096, pingInterval: 60 } });
    const feed = new Listener(url, { instance: "i-slow", service: "js", resources: { vm: ["nic"] }, highWater: 20, backoff: FAST });
    const iterator = feed[Symbol.asyncIterator]();
    const errors = [];
    feed.on("error", (error) => errors.push(error));
    try {
        let event;
        do { event = (await iterator.next()).value; } while (event.type !== "bootstrapDone");
        // The application does not read: 20 frames in, the socket is paused; the kernel's buffers
        // fill; the publisher's window (50 items) passes it.
        const cursors = [];
        for (let batch = 0; batch < 20; batch++) {
            cursors.push(...await fixture.commit(...range(250, (n) => ["vm", `slow-${batch}-${n}-${"x".repeat(200)}`, ["nic"]])));
        }
        const got = [];
        while (got.length < cursors.length) {
            const { value } = await iterator.next();
            if (value.type === "change") got.push(value.cursor);
        }
        assert.deepEqual(got, cursors);
        assert.ok(errors.some((error) => error.closeCode === 4008 || error.closeCode === 1006),
            `expected a slow-consumer close, got ${errors.map((e) => e.message)}`);
    } finally {
        await feed.close();
    }
});

test("4009 (the bucket recreated) gives a resync and a fresh bootstrap", async () => {
    const { url } = await fixture.publisher();
    const feed = new Listener(url, { instance: "i-4009", service: "js", resources: { vm: ["nic"] }, backoff: FAST });
    const record = new Recorder(feed);
    feed.start();
    try {
        await record.until(() => record.of("bootstrapDone").length === 1, "bootstrapped");
        const [seen] = await fixture.commit(vm(1, "e"));
        await record.until(() => record.changes().includes(seen), "a change");
        await fixture.call({ op: "flush" });
        await fixture.commit(vm(2, "e"));
        await record.until(() => record.of("bootstrapDone").length === 2, "bootstrapped again", 30);
        assert.ok(record.errors.some((error) => error.closeCode === 4009), record.errors.map((e) => e.message).join("; "));
        assert.equal(record.of("resync").length, 1);
        assert.match(record.of("resync")[0].reason, /cannot resume/);
        const types = record.events.map((e) => e.type);
        assert.equal(types[types.indexOf("resync") + 1], "bootstrapStart");
    } finally {
        await feed.close();
    }
});

test("a refused registration is fatal and says the close code and the reason", async () => {
    const { url } = await fixture.publisher();
    const feed = new Listener(url, { instance: "i-bad", resources: { disk: ["*"] }, backoff: FAST });
    await assert.rejects(feed.done(), (error) => {
        assert.ok(error instanceof RegistrationRejected);
        assert.equal(error.closeCode, 1008);
        assert.match(error.reason, /unknown resource 'disk'/);
        return true;
    });
});

test("a refused token is fatal: 401 and 403 as Unauthorized", async () => {
    const token = "js-test-token-0123456789abcdef";
    const { createHash } = await import("node:crypto");
    const sha256 = createHash("sha256").update(token).digest("hex");
    const { url } = await fixture.publisher({ auth: { tokens: [
        { name: "reader", sha256, scopes: ["read:vm"] },
    ] } });
    const wrong = new Listener(url, { instance: "i-401", resources: { vm: ["nic"] }, token: "not-the-token-at-all", backoff: FAST });
    await assert.rejects(wrong.done(), (error) => error instanceof Unauthorized && error.status === 401);
    const unscoped = new Listener(url, { instance: "i-403", resources: { vm: ["nic"] }, token, backoff: FAST });
    await assert.rejects(unscoped.done(), (error) => error instanceof Unauthorized && error.status === 403
        && !error.message.includes(token));
});

test("close() stops everything: no reconnection afterwards (Joyent's bug on Node 18+)", async () => {
    const publisher = await fixture.publisher({}, true);
    const feed = new Listener(publisher.url, { instance: "i-close", resources: { vm: ["nic"] }, backoff: { initial: 0.05, maximum: 0.05, retries: 3 } });
    const record = new Recorder(feed);
    let closed = 0;
    feed.on("close", () => { closed += 1; });
    feed.start();
    await record.until(() => record.of("bootstrapDone").length === 1, "bootstrapped");
    await fixture.call({ op: "kill", id: publisher.id });
    await record.until(() => record.errors.length >= 1, "the connection lost");
    await feed.close();
    const errors = record.errors.length;
    await fixture.call({ op: "start", id: publisher.id });
    await sleep(600); // ten backoff delays: a live loop would have reconnected or given up
    assert.equal(record.errors.length, errors);
    assert.equal(record.fatal, null);
    assert.equal(record.registered.length, 1);
    assert.equal(closed, 1);
    await feed.done(); // resolves: closed, not failed
});

test("waitFor(cursor): read-your-writes, and a timeout", async () => {
    const { url } = await fixture.publisher();
    const feed = new Listener(url, { instance: "i-wait", resources: { vm: ["nic"] }, backoff: FAST }).start();
    try {
        const [cursor] = await fixture.commit(vm(1, "w"));
        await feed.waitFor(cursor, { timeout: 20 });
        assert.ok(feed.cursor >= cursor);
        const [epoch] = cursor.split(".");
        const future = `${epoch}.ffffffffffffa0`; // the last millisecond a 12-digit ms can say
        await assert.rejects(feed.waitFor(future, { timeout: 0.2 }), { name: "TimeoutError" });
        await assert.rejects(feed.waitFor("nope"), { name: "CursorError" });
    } finally {
        await feed.close();
    }
});

test("watches: only the ids and prefixes asked for, in the bootstrap and live", async () => {
    const { url } = await fixture.publisher();
    await fixture.commit(["vm", "servers/1", ["nic"]], ["vm", "serversX", ["nic"]], ["vm", "gateway", ["nic"]]);
    const feed = new Listener(url, { instance: "i-watch", resources: { vm: ["nic"] },
        watches: { vm: { ids: ["gateway"], prefixes: ["servers"] } }, backoff: FAST });
    const record = new Recorder(feed);
    feed.start();
    try {
        await record.until(() => record.of("bootstrapDone").length === 1, "bootstrapped");
        const ids = record.of("bootstrapRecords").flatMap((e) => e.objects.map((o) => o.id));
        assert.deepEqual(ids.sort(), ["gateway", "servers/1"]);
        const cursors = await fixture.commit(["vm", "servers/2", ["nic"]], ["vm", "serversY", ["nic"]], ["vm", "gateway", ["nic"]]);
        await record.until(() => record.changes().includes(cursors[2]), "the watched changes");
        assert.deepEqual(record.of("change").map((e) => e.id), ["servers/2", "gateway"]);
    } finally {
        await feed.close();
    }
});

test("a JWT that expires closes the connection (1008); a token function gives a fresh one and it resumes", async () => {
    const { createHmac } = await import("node:crypto");
    const { mkdtempSync, writeFileSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const secret = "a-node-test-secret-of-more-than-32-bytes!";
    const secretFile = join(mkdtempSync(join(tmpdir(), "changefeed-jwt-")), "secret");
    writeFileSync(secretFile, secret);
    const b64 = (value) => Buffer.from(JSON.stringify(value)).toString("base64url");
    const issued = [];
    const token = () => {
        const now = Math.floor(Date.now() / 1000);
        const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64({ sub: "node", aud: "js-test", exp: now + 2, scope: "listen:vm read:vm" })}`;
        issued.push(`${body}.${createHmac("sha256", secret).update(body).digest("base64url")}`);
        return issued.at(-1);
    };
    const { id, url } = await fixture.publisher({ auth: { jwt: { secretFile, audience: "js-test" } } });
    const feed = new Listener(url, { instance: "i-jwt", resources: { vm: ["nic"] }, token, backoff: FAST });
    const record = new Recorder(feed);
    feed.start();
    try {
        await record.until(() => record.of("bootstrapDone").length === 1, "bootstrapped with a JWT");
        await record.until(() => record.errors.some((e) => e.closeCode === 1008), "closed when the token expired", 10);
        assert.match(record.errors.find((e) => e.closeCode === 1008).reason, /expired token of 'jwt:node'/);
        const [cursor] = await fixture.commit(vm(1, "jwt"));
        await record.until(() => record.changes().includes(cursor), "a change after reconnecting with a new token");
        assert.ok(issued.length >= 2);
        assert.equal(record.of("bootstrapStart").length, 1, "resumed, not bootstrapped again");
        const output = await fixture.call({ op: "output", id });
        for (const jwt of issued) {
            for (const part of jwt.split(".").slice(1)) assert.ok(!output.includes(part), "token text in the publisher's log");
        }
    } finally {
        await feed.close();
    }
});

test("TLS: an https publisher verified with the given CA; without it the attempt fails and is retried", async () => {
    const { readFileSync } = await import("node:fs");
    const pki = await fixture.call({ op: "pki" });
    const { url } = await fixture.publisher({ tls: { certFile: pki.cert, keyFile: pki.key } });
    assert.ok(url.startsWith("https://"));
    const feed = new Listener(url, { instance: "i-tls", resources: { vm: ["nic"] }, tls: { ca: readFileSync(pki.ca) }, backoff: FAST });
    const record = new Recorder(feed);
    feed.start();
    const untrusting = new Listener(url, { instance: "i-tls-no-ca", resources: { vm: ["nic"] }, backoff: FAST });
    const refused = new Recorder(untrusting);
    untrusting.start();
    try {
        await record.until(() => record.of("bootstrapDone").length === 1, "bootstrapped over TLS");
        const [cursor] = await fixture.commit(vm(1, "tls"));
        await record.until(() => record.changes().includes(cursor), "a change over wss");
        await refused.until(() => refused.errors.length >= 1, "the unverified attempt failed");
        assert.match(refused.errors[0].message, /certificate/);
        assert.equal(refused.registered.length, 0);
    } finally {
        await feed.close();
        await untrusting.close();
    }
});

test("close() during an upgrade that hangs returns at once", async () => {
    const { createServer } = await import("node:net");
    const sockets = [];
    const silent = createServer((socket) => sockets.push(socket)); // accepts, never answers
    await new Promise((resolve) => silent.listen(0, "127.0.0.1", resolve));
    const feed = new Listener(`http://127.0.0.1:${silent.address().port}`, { instance: "i-hang", resources: { vm: ["nic"] }, openTimeout: 60 }).start();
    try {
        while (sockets.length === 0) await sleep(10);
        const started = Date.now();
        await feed.close();
        assert.ok(Date.now() - started < 1000, `close() took ${Date.now() - started} ms`);
    } finally {
        for (const socket of sockets) socket.destroy();
        silent.close();
    }
});

test("coalesce: asked in the registration, granted in the reply", async () => {
    const { url } = await fixture.publisher();
    const feed = new Listener(url, { instance: "i-coalesce", resources: { vm: ["nic"] }, coalesce: true, backoff: FAST });
    const record = new Recorder(feed);
    feed.start();
    try {
        await record.until(() => record.registered.length === 1, "registered");
        assert.equal(record.registered[0].coalesce, true);
        const stats = await (await fetch(`${url}/changefeeds/stats`)).json();
        assert.ok(stats.registrations.some((r) => r.instance === "i-coalesce"));
    } finally {
        await feed.close();
    }
});
