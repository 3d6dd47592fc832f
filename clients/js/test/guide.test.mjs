// docs/guide.md's Node path, run as written in a process of its own: Joyent's Listener code on
// `changefeed-listener/compat` hears a commit. The only changes to the snippet are the
// publisher's URL and where `require` finds the package (this checkout's CommonJS build).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { FACTOR, Fixture, REPO } from "./harness.mjs";

const SNIPPET = /<!-- guide: node -->\n```js\n([\s\S]*?)^```/m;

let fixture;
before(async () => { fixture = await Fixture.start(); });
after(async () => { await fixture?.close(); });

test("the guide's Node listener hears a commit", async () => {
    const found = SNIPPET.exec(readFileSync(join(REPO, "docs", "guide.md"), "utf8"));
    assert.ok(found, "docs/guide.md lost its node snippet");
    const { url } = await fixture.publisher();
    const build = join(REPO, "clients", "js", "dist", "cjs", "compat", "index.js");
    const code = found[1]
        .replace('require("changefeed-listener/compat")', `require(${JSON.stringify(build)})`)
        .replace("http://127.0.0.1:8080", url);
    assert.notEqual(code, found[1]);
    const dir = mkdtempSync(join(tmpdir(), "guide-"));
    writeFileSync(join(dir, "listen.cjs"), code);
    const child = spawn(process.execPath, [join(dir, "listen.cjs")], { stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (chunk) => { stderr += chunk; });
    const lines = createInterface({ input: child.stdout });
    const seen = [];
    try {
        const heard = new Promise((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`nothing heard: ${seen.join("\n")}\n${stderr}`)), 20000 * FACTOR);
            lines.on("line", (line) => {
                seen.push(line);
                if (line.startsWith("bootstrap vm")) {
                    fixture.commit(["vm", "guide-1", ["nic"]]).catch(reject);
                } else if (line.startsWith("{")) {
                    clearTimeout(timer);
                    resolve(JSON.parse(line));
                }
            });
        });
        const change = await heard;
        assert.equal(change.changedResourceId, "guide-1");
        assert.deepEqual(change.changeKind, { resource: "vm", subResources: ["nic"] });
    } finally {
        child.kill();
        rmSync(dir, { recursive: true, force: true });
    }
});
