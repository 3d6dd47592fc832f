// The package as another Node project gets it: `npm pack` (its prepack builds dist/) makes the
// tarball the READMEs tell a project to `npm install`; installed into an empty project (`ws`
// from the npm cache or registry), the READMEs' Node snippets run there, as ESM and CommonJS,
// against a real publisher.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { FACTOR, Fixture, REPO } from "../harness.mjs";

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const URL_IN_SNIPPETS = "http://127.0.0.1:8080";

/** The ```js blocks of `markdown` (from `heading` to the next heading of its level, if given). */
function jsBlocks(markdown, heading) {
    let text = markdown;
    if (heading) {
        const start = text.indexOf(`\n${heading}\n`);
        assert.ok(start >= 0, `no "${heading}" section`);
        const level = heading.split(" ")[0];
        const end = text.indexOf(`\n${level} `, start + heading.length + 2);
        text = text.slice(start, end < 0 ? undefined : end);
    }
    return [...text.matchAll(/```js\n([\s\S]*?)```/g)].map((match) => match[1]);
}

const readme = readFileSync(join(REPO, "README.md"), "utf8");
const packageReadme = readFileSync(join(root, "README.md"), "utf8");
const snippets = {
    "README.md (ESM)": jsBlocks(readme).find((code) => code.includes('from "changefeed-listener"')),
    "clients/js/README.md (ESM)": jsBlocks(packageReadme, "## Node").find((code) => code.includes("import {")),
    "clients/js/README.md (CommonJS)": jsBlocks(packageReadme, "## Node").find((code) => code.includes("require(")),
};

let fixture, publisher, tmp, project, tarball;
before(async () => {
    fixture = await Fixture.start();
    publisher = await fixture.publisher();
    tmp = mkdtempSync(join(tmpdir(), "changefeed-package-"));
    const { stdout } = await run(npm, ["pack", "--json", "--pack-destination", tmp], { cwd: root, timeout: 300000 * FACTOR });
    const [packed] = JSON.parse(stdout);
    tarball = { path: join(tmp, packed.filename), files: packed.files.map((file) => file.path) };
    project = join(tmp, "consumer");
    await run("mkdir", [project]);
    writeFileSync(join(project, "package.json"), JSON.stringify({ name: "consumer", private: true, version: "1.0.0" }));
    await run(npm, ["install", "--no-audit", "--no-fund", "--prefer-offline", tarball.path],
        { cwd: project, timeout: 300000 * FACTOR });
});
after(async () => {
    await fixture?.close();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
});

test("npm pack: the tarball holds the built ESM, CommonJS, .d.ts and browser modules, and no sources", () => {
    for (const file of ["package.json", "README.md", "dist/esm/index.js", "dist/esm/index.d.ts",
        "dist/cjs/index.js", "dist/cjs/index.d.ts", "dist/cjs/package.json", "dist/esm/compat/index.js",
        "dist/cjs/compat/index.js", "dist/browser/browser/index.js"]) {
        assert.ok(tarball.files.includes(file), `${file} not in ${tarball.path}`);
    }
    assert.ok(!tarball.files.some((file) => file.startsWith("src/") || file.startsWith("test/")));
});

/** The number of listeners registered on the publisher (its /changefeeds/stats). */
async function registered() {
    const response = await fetch(`${publisher.url}/changefeeds/stats`);
    return (await response.json()).listeners;
}

/** Run `code` as `file` in the project until it prints a change committed once it registered. */
async function runSnippet(file, code) {
    writeFileSync(join(project, file), code.replaceAll(URL_IN_SNIPPETS, publisher.url));
    const child = spawn(process.execPath, [file], { cwd: project, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "", stderr = "";
    child.stdout.on("data", (chunk) => { stdout += chunk; });
    child.stderr.on("data", (chunk) => { stderr += chunk; });
    const exited = new Promise((resolve) => child.once("exit", resolve));
    const deadline = Date.now() + 30000 * FACTOR;
    try {
        // Registered: a change committed now reaches it live (buffered during its bootstrap).
        while (await registered() === 0) {
            assert.ok(child.exitCode === null, `${file} exited: ${stderr}`);
            assert.ok(Date.now() < deadline, `${file} did not register: ${stdout}${stderr}`);
            await new Promise((resolve) => setTimeout(resolve, 50));
        }
        const id = `snippet-${file.replace(/\W/g, "-")}`;
        const [cursor] = await fixture.commit(["vm", id, ["nic"], { uuid: id }]);
        await new Promise((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`${file} printed no change ${id}:\n${stdout}\n${stderr}`)),
                deadline - Date.now());
            const check = () => {
                if (stdout.includes(id) && stdout.includes(cursor)) { clearTimeout(timer); resolve(); }
            };
            child.stdout.on("data", check);
            exited.then(() => { clearTimeout(timer); reject(new Error(`${file} exited:\n${stdout}\n${stderr}`)); });
            check();
        });
        assert.equal(stderr, "");
    } finally {
        child.kill();
        await exited;
        while (await registered() !== 0) await new Promise((resolve) => setTimeout(resolve, 50));
    }
}

for (const [where, code] of Object.entries(snippets)) {
    test(`the ${where} Node snippet runs in a project that installed the tarball`, async () => {
        assert.ok(code, `no Node snippet in ${where}`);
        assert.ok(code.includes(URL_IN_SNIPPETS), `the snippet of ${where} has no ${URL_IN_SNIPPETS}`);
        await runSnippet(where.includes("CommonJS") ? "listen.cjs" : "listen.mjs", code);
    });
}
