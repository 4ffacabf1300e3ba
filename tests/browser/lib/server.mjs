// Drives the real `countersign` binary: a `serve` process on port 0 in a temporary data
// directory, one-shot CLI commands against the same directory, and plain HTTP calls.

import { spawn, execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";

const execFileP = promisify(execFile);

const ANSI = /\x1b\[[0-9;]*m/g;

/** The environment for a child: the binary refuses unknown `COUNTERSIGN_*` variables and
 * known ones would change what it does, so none of ours reaches it. */
function childEnv() {
  const env = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith("COUNTERSIGN_")) env[key] = value;
  }
  env.NO_COLOR = "1";
  return env;
}

const children = new Set();

/** Kills every child this module started (also on an unexpected exit). */
export function killChildren() {
  for (const child of children) {
    try {
      child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
  children.clear();
}
process.on("exit", killChildren);
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => {
    killChildren();
    process.exit(128 + (signal === "SIGINT" ? 2 : signal === "SIGTERM" ? 15 : 1));
  });
}

export class Countersign {
  /** `files`: written into the data directory before it starts, by name (say a
   * `countersign.toml`, which `serve` reads from there, and the policy files it names). */
  constructor(bin, { files = {} } = {}) {
    if (!bin) throw new Error("COUNTERSIGN_BIN is not set: point it at the countersign binary");
    if (!fs.existsSync(bin)) throw new Error(`COUNTERSIGN_BIN ${bin} does not exist`);
    this.bin = bin;
    this.dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "countersign-browser-"));
    for (const [name, text] of Object.entries(files)) fs.writeFileSync(path.join(this.dataDir, name), text);
    this.stderr = "";
    this.child = null;
    this.base = null;
    this.setupLink = null;
  }

  /** Starts `countersign serve --listen 127.0.0.1:0` and waits for its address and, on a
   * fresh directory, the first admin's setup link. */
  async start() {
    const child = spawn(this.bin, ["serve", "--listen", "127.0.0.1:0", "--data-dir", this.dataDir], {
      env: childEnv(),
      stdio: ["ignore", "ignore", "pipe"],
    });
    this.child = child;
    children.add(child);
    child.on("exit", () => children.delete(child));
    child.stderr.setEncoding("utf8");
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`serve did not print its address and setup link within 20 s; stderr:\n${this.stderr}`)), 20_000);
      child.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`serve exited (${code}) before it was ready; stderr:\n${this.stderr}`));
      });
      child.stderr.on("data", (chunk) => {
        this.stderr += chunk.replace(ANSI, "");
        const listening = this.stderr.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
        const setup = this.stderr.match(/create it within \d+ minutes at (http:\/\/\S+\/setup\?token=\S+)/);
        if (listening) this.base = listening[1];
        if (setup) this.setupLink = setup[1];
        if (this.base && this.setupLink) {
          clearTimeout(timer);
          resolve();
        }
      });
    });
    return this;
  }

  stop() {
    if (this.child) this.child.kill("SIGKILL");
  }

  cleanup() {
    this.stop();
    fs.rmSync(this.dataDir, { recursive: true, force: true });
  }

  url(p) {
    return `${this.base}${p}`;
  }

  /** Runs `countersign ARGS... --data-dir DIR` to completion and returns its stdout. */
  async cli(...args) {
    try {
      const { stdout } = await execFileP(this.bin, [...args, "--data-dir", this.dataDir], {
        env: childEnv(),
        timeout: 30_000,
      });
      return stdout.trim();
    } catch (err) {
      throw new Error(`countersign ${args.join(" ")} failed: ${err.message}\n${err.stderr || ""}`);
    }
  }

  /** A bearer token (the one line `token create` prints). */
  async token(role, name) {
    return this.cli("token", "create", "--role", role, "--name", name);
  }

  /** `countersign user add`: the invitation link. */
  async invite(username, role, displayName) {
    const args = ["user", "add", "--username", username, "--role", role];
    if (displayName) args.push("--display-name", displayName);
    return this.cli(...args);
  }

  /** Plain HTTP with an optional bearer token; returns {status, headers, body, text}. */
  async http(method, p, { token, json, headers = {}, timeoutMs = 10_000 } = {}) {
    const h = { ...headers };
    if (token) h.authorization = `Bearer ${token}`;
    if (json !== undefined) h["content-type"] = "application/json";
    const response = await fetch(this.url(p), {
      method,
      headers: h,
      body: json === undefined ? undefined : JSON.stringify(json),
      redirect: "manual",
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await response.text();
    let body = null;
    try {
      body = JSON.parse(text);
    } catch {
      // not JSON
    }
    return { status: response.status, headers: response.headers, body, text };
  }

  /** Creates a request over REST as an agent token; returns its id. */
  async createRequest(token, request) {
    const r = await this.http("POST", "/api/v1/requests", { token, json: request });
    if (r.status !== 201) throw new Error(`POST /api/v1/requests: ${r.status} ${r.text}`);
    return r.body.request_id;
  }

  /** The newest signed checkpoint's tree size (the log batches appends for 100 ms). */
  async logSize() {
    const r = await this.http("GET", "/api/v1/log/checkpoint", { token: this.readToken });
    if (r.status !== 200) throw new Error(`GET /api/v1/log/checkpoint: ${r.status} ${r.text}`);
    // C2SP checkpoint: origin line, then the tree size.
    return Number(r.text.split("\n")[1]);
  }
}
