// The pure parts, synchronously: backoff, URLs, watches, the state machine's decisions, and the
// package's version kept in step with pyproject.toml.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { Backoff } from "../dist/esm/backoff.js";
import { ListenerCore } from "../dist/esm/core.js";
import { ConnectionLost, HttpError, ProtocolError, RegistrationRejected, RetriesExhausted, Unauthorized } from "../dist/esm/errors.js";
import { publisherUrls, watchMatches } from "../dist/esm/protocol.js";

test("backoff: grows by factor up to maximum, jittered downwards, bounded by retries", () => {
    const delays = [...new Backoff({ initial: 1, maximum: 8, factor: 2, jitter: 0.5, retries: 6 }).delays(() => 1)];
    assert.deepEqual(delays, [0.5, 1, 2, 4, 4, 4]);
    const none = [...new Backoff({ initial: 1, maximum: 8, jitter: 0.5, retries: 3 }).delays(() => 0)];
    assert.deepEqual(none, [1, 2, 4]);
    assert.throws(() => new Backoff({ initial: 0 }), /initial/);
    assert.throws(() => new Backoff({ jitter: 2 }), /jitter/);
});

test("publisher URLs: http, ws and .../changefeeds all give the base and the websocket", () => {
    assert.deepEqual(publisherUrls("http://h:1"), ["http://h:1", "ws://h:1/changefeeds"]);
    assert.deepEqual(publisherUrls("wss://h/x/changefeeds/"), ["https://h/x", "wss://h/x/changefeeds"]);
    assert.throws(() => publisherUrls("ftp://h"), /expected http/);
});

test("watches match whole segments", () => {
    const watch = { ids: ["gateway"], prefixes: ["servers/"] };
    assert.ok(watchMatches(watch, "servers") && watchMatches(watch, "servers/1/nic") && watchMatches(watch, "gateway"));
    assert.ok(!watchMatches(watch, "serversX") && !watchMatches(watch, "gateway/1"));
    assert.ok(watchMatches(undefined, "anything"));
});

const core = (options = {}) => new ListenerCore(["http://a:1", "http://b:2"], {
    instance: "i", service: "s", resources: { vm: ["nic"] }, random: () => 0, backoff: { initial: 1, maximum: 4 }, ...options,
});
const reply = (extra) => JSON.stringify({ resource: "vm", subResources: ["nic"], bootstrapRoute: "/vms", cursor: "e.01", ...extra });

test("core: v1 for one resource, v2 for several; since and coalesce in the registration", () => {
    const one = core({ since: "e.05", coalesce: true }).attempt();
    assert.equal(one.version, 1);
    assert.deepEqual(JSON.parse(one.frame), { instance: "i", service: "s", changeKind: { resource: "vm", subResources: ["nic"] }, since: "e.05", coalesce: true });
    const two = core({ resources: { vm: ["nic"], network: ["*"] } }).attempt();
    assert.equal(two.version, 2);
    assert.equal(JSON.parse(two.frame).resources.length, 2);
});

test("core: resumed keeps the view; resumed false after a view is a resync and a bootstrap", () => {
    const c = core({ since: "e.05" });
    c.attempt();
    assert.equal(c.reply(reply({ resumed: true }), 0).resumed, true);
    assert.equal(c.cursor, "e.05");
    c.failed(new ConnectionLost("u", 1006, ""), 1);
    c.attempt();
    const plan = c.reply(reply({ resumed: false }), 2);
    assert.match(plan.resync, /cannot resume after cursor e.05/);
    assert.deepEqual(plan.routes.map((r) => r.resource), ["vm"]);
    assert.equal(c.bootstrapDone("vm", 3), "e.01");
});

test("core: what is retried, on the next URL, and what is fatal", () => {
    const c = core();
    assert.equal(c.attempt().url, "http://a:1");
    assert.equal(c.failed(new ConnectionLost("u", 4008, "slow consumer"), 0), 1);
    assert.equal(c.attempt().url, "http://b:2");
    assert.equal(c.failed(new ConnectionLost("u", 1008, "no registration within 10 s"), 0), 2);
    c.attempt();
    assert.equal(c.failed(new HttpError("u", 503, "TryAgainLater", ""), 0), 4);
    c.attempt();
    assert.throws(() => c.failed(new ConnectionLost("u", 1008, "unknown resource 'disk'"), 0), RegistrationRejected);
    const d = core();
    d.attempt();
    assert.throws(() => d.failed(new Unauthorized("u", 401, "Unauthorized", ""), 0), Unauthorized);
    const e = core({ since: "e.09" });
    e.attempt();
    e.failed(new ConnectionLost("u", 1008, "since: invalid cursor 'e.09'"), 0);
    assert.equal(e.cursor, null, "a refused cursor is dropped: bootstrap");
    const f = core({ backoff: { initial: 1, maximum: 1, retries: 1 } });
    f.attempt();
    f.failed(new ProtocolError("x"), 0);
    f.attempt();
    assert.throws(() => f.failed(new ProtocolError("x"), 0), RetriesExhausted);
});

test("the package version is pyproject.toml's", () => {
    const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url)));
    const lock = JSON.parse(readFileSync(new URL("../package-lock.json", import.meta.url)));
    const pyproject = readFileSync(new URL("../../../pyproject.toml", import.meta.url), "utf8");
    const version = /^version = "([^"]+)"/m.exec(pyproject)[1];
    assert.equal(pkg.version, version);
    assert.equal(lock.version, version);
    assert.deepEqual(Object.keys(pkg.dependencies), ["ws"], "ws is the only runtime dependency");
});

test("the package's entry points resolve: ESM and CommonJS, the Node listener and compat", async () => {
    const { createRequire } = await import("node:module");
    const require = createRequire(import.meta.url);
    assert.equal(typeof require("changefeed-listener").Listener, "function");
    assert.equal(typeof require("changefeed-listener/compat").createListener, "function");
    assert.equal(typeof (await import("changefeed-listener")).Listener, "function");
    assert.equal(typeof (await import("changefeed-listener/compat")).Listener, "function");
});

test("the browser module's size is what the README states (within 5 %)", async () => {
    const { readdirSync, statSync } = await import("node:fs");
    const { gzipSync } = await import("node:zlib");
    const dirs = ["../dist/browser/", "../dist/browser/browser/"].map((d) => new URL(d, import.meta.url));
    const files = dirs.flatMap((dir) => readdirSync(dir).filter((f) => f.endsWith(".js")).map((f) => new URL(f, dir)));
    const raw = files.reduce((sum, file) => sum + statSync(file).size, 0);
    const gzipped = files.reduce((sum, file) => sum + gzipSync(readFileSync(file), { level: 9 }).length, 0);
    const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
    const [, count, kb, gzKb] = /(\d+) ES modules,\s+([\d.]+) KB as compiled \(with comments\), ([\d.]+) KB gzipped/.exec(readme);
    assert.equal(files.length, Number(count));
    assert.ok(Math.abs(raw / 1000 - Number(kb)) / Number(kb) < 0.05, `${raw} bytes, README says ${kb} KB`);
    assert.ok(Math.abs(gzipped / 1000 - Number(gzKb)) / Number(gzKb) < 0.05, `${gzipped} bytes gzipped, README says ${gzKb} KB`);
});
