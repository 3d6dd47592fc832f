// Builds dist/esm (ESM + .d.ts), dist/cjs (CommonJS + .d.ts) and dist/browser (the browser ES
// module) with the locked TypeScript compiler; no bundler.
import { execFileSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
rmSync(join(root, "dist"), { recursive: true, force: true });
for (const project of ["tsconfig.json", "tsconfig.cjs.json", "tsconfig.browser.json"]) {
    execFileSync(process.execPath, [tsc, "-p", join(root, project)], { stdio: "inherit", cwd: root });
}
mkdirSync(join(root, "dist/cjs"), { recursive: true });
writeFileSync(join(root, "dist/cjs/package.json"), '{"type": "commonjs"}\n');
