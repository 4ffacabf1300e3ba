// The package as npm ships it: `npm pack` makes the tarball, a fresh project installs it
// (no registry needed: it has no dependencies), and its entry point and types are there.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = fileURLToPath(new URL("..", import.meta.url));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

test("npm pack, then install from the tarball and import it", (t) => {
  const dir = mkdtempSync(join(tmpdir(), "countersign-verify-pack-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const quiet = ["--no-audit", "--no-fund", "--loglevel=error"];
  const packed = JSON.parse(execFileSync(npm, ["pack", "--json", "--pack-destination", dir, ...quiet], { cwd: pkgDir, encoding: "utf8" }));
  const files = packed[0].files.map((f) => f.path).sort();
  assert.deepEqual(files, ["README.md", "index.d.ts", "index.js", "package.json"]);

  const app = join(dir, "app");
  mkdirSync(app);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  execFileSync(npm, ["install", "--offline", "--ignore-scripts", ...quiet, join(dir, packed[0].filename)], { cwd: app });
  const installed = join(app, "node_modules", "@countersign", "verify");
  assert.deepEqual(readdirSync(installed).sort(), ["README.md", "index.d.ts", "index.js", "package.json"]);
  assert.match(readFileSync(join(installed, "index.d.ts"), "utf8"), /export declare function verifyProof/);

  writeFileSync(
    join(app, "main.js"),
    'import { computeActionDigest, verifyProof, JwksCache, redeemProof } from "@countersign/verify";\n' +
      'console.log(JSON.stringify([computeActionDigest("Delete staging database", {}), typeof verifyProof, typeof JwksCache, typeof redeemProof]));\n',
  );
  const out = JSON.parse(execFileSync(process.execPath, ["main.js"], { cwd: app, encoding: "utf8" }));
  assert.deepEqual(out, [
    "sha256:63f9d847294aced392cec1056dda9f0b363c14c0f6838dd72844f3e926fa2adb",
    "function",
    "function",
    "function",
  ]);
});
