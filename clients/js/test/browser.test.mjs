// The browser build in headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core,
// which downloads nothing): a page served by this test, on another origin than the publisher
// (allowedOrigins, CORS), registers with a JWT over WebSocket (subprotocol) and over SSE
// (access_token), receives changes, and resumes after the publisher is killed and restarted.
import assert from "node:assert/strict";
import { createHmac, generateKeyPairSync, sign } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, extname, join, normalize } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { FACTOR, Fixture } from "./harness.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const SECRET = "a-browser-test-secret-of-more-than-32-bytes";
const AUDIENCE = "changefeed-browser-test";

const b64 = (value) => Buffer.from(typeof value === "string" ? value : JSON.stringify(value)).toString("base64url");

/** An HS256 JWT, as an application's backend would mint it. */
function mint(claims, secret = SECRET) {
    const now = Math.floor(Date.now() / 1000);
    const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64({ sub: "page-user", aud: AUDIENCE, iat: now, exp: now + 300, scope: "listen:vm listen:network read:vm read:network", ...claims })}`;
    return `${body}.${createHmac("sha256", secret).update(body).digest("base64url")}`;
}

let fixture, server, origin, browser, profile, secretFile, tmp;
before(async () => {
    assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: apt-get install chromium (.ci/run does)`);
    fixture = await Fixture.start();
    server = createServer((request, response) => {
        const path = new URL(request.url, "http://x").pathname;
        const file = path === "/" ? join(here, "browser", "page.html") : normalize(join(root, path));
        if (!file.startsWith(root) || !existsSync(file)) {
            response.writeHead(404).end();
            return;
        }
        const types = { ".html": "text/html", ".js": "text/javascript" };
        response.writeHead(200, { "Content-Type": types[extname(file)] ?? "application/octet-stream" });
        response.end(readFileSync(file));
    });
    await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
    origin = `http://127.0.0.1:${server.address().port}`;
    tmp = mkdtempSync(join(tmpdir(), "changefeed-browser-"));
    secretFile = join(tmp, "jwt.secret");
    writeFileSync(secretFile, SECRET);
    profile = join(tmp, "profile");
    browser = await chromium.launchPersistentContext(profile, {
        executablePath: CHROMIUM, headless: true,
        args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"],
    });
});
after(async () => {
    await browser?.close();
    server?.close();
    await fixture?.close();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
});

async function publisher() {
    return fixture.publisher({
        allowedOrigins: [origin],
        auth: { jwt: { secretFile, audience: AUDIENCE } },
    }, true);
}

async function open(url, token = "") {
    const page = await browser.newPage();
    page.on("pageerror", (error) => { throw error; });
    await page.goto(`${origin}/?publisher=${encodeURIComponent(url)}&token=${encodeURIComponent(token)}`);
    await page.waitForFunction(() => window.ready === true);
    return page;
}

const changes = (events) => events.filter((e) => e.type === "change").map((e) => e.cursor);

async function until(page, predicate, arg, what) {
    try {
        await page.waitForFunction(predicate, arg, { timeout: 30000 * FACTOR, polling: 50 });
    } catch (error) {
        const seen = await page.evaluate(() => window.seen);
        throw new Error(`${what}: ${error.message}\n${JSON.stringify(seen).slice(0, 3000)}`);
    }
}

test("a page receives changes over WebSocket and SSE with a JWT, and resumes after a restart", async () => {
    const { id, url } = await publisher();
    const token = mint();
    await fixture.commit(["vm", "boot-1", ["nic"]]);
    const page = await open(url, token);
    try {
        await until(page, () => window.seen.ws.filter((e) => e.type === "bootstrapDone").length === 2
            && window.seen.sse.some((e) => e.type === "bootstrapDone"), null, "bootstrapped");
        const seen = await page.evaluate(() => window.seen);
        assert.ok(seen.ws.some((e) => e.type === "records" && e.ids.includes("boot-1")));
        assert.ok(seen.sse.some((e) => e.type === "records" && e.ids.includes("boot-1")));
        const before = await fixture.commit(["vm", "a", ["nic"]], ["network", "n", ["ips"]], ["vm", "b", ["nic"]]);
        await until(page, (last) => window.seen.ws.some((e) => e.cursor === last)
            && window.seen.sse.some((e) => e.cursor === last), before[2], "the first changes");
        await fixture.call({ op: "kill", id });
        const during = await fixture.commit(["vm", "c", ["nic"]]);
        await fixture.call({ op: "start", id });
        const later = await fixture.commit(["vm", "d", ["nic"]]);
        await until(page, (last) => window.seen.ws.some((e) => e.cursor === last)
            && window.seen.sse.some((e) => e.cursor === last), later[0], "the changes after the restart");
        const after = await page.evaluate(() => window.seen);
        assert.deepEqual(changes(after.ws), [...before, ...during, ...later]);
        assert.deepEqual(changes(after.sse), [before[0], before[2], ...during, ...later]);
        assert.equal(after.ws.filter((e) => e.type === "bootstrapStart").length, 2, "resumed, not bootstrapped again");
        assert.equal(after.sse.filter((e) => e.type === "bootstrapStart").length, 1, "resumed, not bootstrapped again");
        assert.deepEqual(after.fatal, []);
        const output = await fixture.call({ op: "output", id });
        for (const part of token.split(".")) assert.ok(!output.includes(part), "token text in the publisher's log");
    } finally {
        await page.close();
    }
});

test("a page with a token of the wrong signature is refused: 401 on both", async () => {
    const { id, url } = await publisher();
    const token = mint({}, "another-secret-of-more-than-32-bytes-xyz");
    const page = await open(url, token);
    try {
        await until(page, () => window.seen.fatal.length === 2, null, "both refused");
        const fatal = await page.evaluate(() => window.seen.fatal);
        assert.deepEqual(fatal.map((f) => [f.name, f.error, f.status]).sort(),
            [["sse", "Unauthorized", 401], ["ws", "Unauthorized", 401]]);
        const output = await fixture.call({ op: "output", id });
        for (const part of token.split(".")) assert.ok(!output.includes(part), "token text in the publisher's log");
    } finally {
        await page.close();
    }
});

test("a page of an origin the publisher does not allow: one OriginNotAllowed on each, no retries", async () => {
    const { url } = await fixture.publisher({
        allowedOrigins: ["https://elsewhere.example"], auth: { jwt: { secretFile, audience: AUDIENCE } },
    });
    const page = await open(url, mint());
    try {
        await until(page, () => window.seen.fatal.length === 2, null, "both refused");
        const { fatal, errors } = await page.evaluate(() => window.seen);
        assert.deepEqual(fatal.map((f) => [f.name, f.error, f.code, f.status]).sort(),
            [["sse", "OriginNotAllowed", "OriginNotAllowed", 403], ["ws", "OriginNotAllowed", "OriginNotAllowed", 403]]);
        assert.match(fatal[0].message, new RegExp(`origin ${origin}.*allowedOrigins`));
        await new Promise((resolve) => setTimeout(resolve, 500)); // 10 backoff delays of the page's
        const later = await page.evaluate(() => window.seen);
        assert.equal(later.fatal.length, 2, "retried what cannot succeed");
        assert.deepEqual([errors, later.errors], [[], []], "a refusal is one error, not retries");
    } finally {
        await page.close();
    }
});

test("a page without a token: one Unauthorized on each; start() again with a token registers", async () => {
    const { url } = await publisher();
    const page = await open(url);
    try {
        await until(page, () => window.seen.fatal.length === 2, null, "both refused");
        const { fatal, errors } = await page.evaluate(() => window.seen);
        assert.deepEqual(fatal.map((f) => [f.name, f.error, f.code, f.status]).sort(),
            [["sse", "Unauthorized", "Unauthorized", 401], ["ws", "Unauthorized", "Unauthorized", 401]]);
        assert.deepEqual(errors, []);
        await page.evaluate((token) => { window.token = token; window.feeds.ws.start(); }, mint());
        await until(page, () => window.seen.ws.filter((e) => e.type === "bootstrapDone").length === 2, null,
            "registered after start()");
        const [cursor] = await fixture.commit(["vm", "after-start", ["nic"]]);
        await until(page, (last) => window.seen.ws.some((e) => e.cursor === last), cursor, "a change");
        assert.equal((await page.evaluate(() => window.seen.fatal)).length, 2);
    } finally {
        await page.close();
    }
});

/** A JWT signed with `privateKey` (RS256 or EdDSA), as an identity provider would sign it. */
function mintWith(alg, privateKey, kid) {
    const now = Math.floor(Date.now() / 1000);
    const body = `${b64({ alg, typ: "JWT", kid })}.${b64({ sub: "page-user", aud: AUDIENCE, iat: now, exp: now + 300, scope: "listen:vm listen:network read:vm read:network" })}`;
    const signature = alg === "RS256"
        ? sign("sha256", Buffer.from(body), privateKey)
        : sign(null, Buffer.from(body), privateKey);
    return `${body}.${signature.toString("base64url")}`;
}

for (const alg of ["RS256", "EdDSA"]) {
    test(`a page registers over WebSocket and SSE with an ${alg} token of a JWKS`, async () => {
        const { publicKey, privateKey } = alg === "RS256"
            ? generateKeyPairSync("rsa", { modulusLength: 2048 })
            : generateKeyPairSync("ed25519");
        const jwksFile = join(tmp, `${alg}.jwks.json`);
        writeFileSync(jwksFile, JSON.stringify({ keys: [{ ...publicKey.export({ format: "jwk" }), kid: "k1", alg, use: "sig" }] }));
        const { url } = await fixture.publisher({
            allowedOrigins: [origin], auth: { jwt: { jwksFile, audience: AUDIENCE, algorithms: [alg] } },
        });
        const page = await open(url, mintWith(alg, privateKey, "k1"));
        try {
            await until(page, () => window.seen.ws.filter((e) => e.type === "bootstrapDone").length === 2
                && window.seen.sse.some((e) => e.type === "bootstrapDone"), null, "bootstrapped");
            const [cursor] = await fixture.commit(["vm", `${alg}-1`, ["nic"]]);
            await until(page, (last) => window.seen.ws.some((e) => e.cursor === last)
                && window.seen.sse.some((e) => e.cursor === last), cursor, "a change on both");
            assert.deepEqual(await page.evaluate(() => window.seen.fatal), []);
        } finally {
            await page.close();
        }
    });
}
