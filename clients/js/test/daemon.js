// A real `rankd serve` for the tests: free loopback ports, a temporary data
// dir, stopped by its pid.  RANKD_PYTHON names the Python with rankd
// installed (default: the project's .venv, else python3).
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(fileURLToPath(import.meta.url), "../../../..");

export function python() {
  if (process.env.RANKD_PYTHON) return process.env.RANKD_PYTHON;
  const venv = join(ROOT, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

export function freePort() {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => done(port));
    });
  });
}

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

export class Daemon {
  constructor(...args) {
    this.args = args;
    this.dataDir = mkdtempSync(join(tmpdir(), "rankd-js-"));
    this.output = [];
  }

  get url() { return `http://127.0.0.1:${this.port}`; }

  async start({ timeoutMs = 30_000 } = {}) {
    // A free port may be taken by another process between its pick and the
    // daemon's bind (tests run in parallel): then pick again (the HTTP port
    // of a restart stays: it is tried again) and start again.
    const fresh = this.port === undefined;
    for (let attempt = 1; ; attempt++) {
      if (fresh && attempt > 1) this.port = undefined;
      if (await this.#startOnce(timeoutMs)) return this;
      const output = this.output.join("");
      if (attempt >= 5 || !output.includes("address already in use")) {
        throw new Error(`rankd did not start:\n${output}`);
      }
      await sleep(100);
    }
  }

  async #startOnce(timeoutMs) {
    this.port ??= await freePort();
    const ports = ["--port", String(this.port), "--tcp-port", String(await freePort()),
                   "--resp-port", String(await freePort())];
    this.output = [];
    this.process = spawn(python(), ["-m", "rankd.cli", "serve", "--host", "127.0.0.1", ...ports,
                                    "--data-dir", join(this.dataDir, "data"), ...this.args],
                         { stdio: ["ignore", "pipe", "pipe"] });
    for (const stream of [this.process.stdout, this.process.stderr]) {
      stream.on("data", (chunk) => this.output.push(chunk.toString()));
    }
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      if (this.process.exitCode !== null) break;
      try {
        if ((await fetch(`${this.url}/v1/health`)).ok) return true;
      } catch { /* not listening yet */ }
      await sleep(100);
    }
    await this.stop();
    return false;
  }

  /** SIGTERM by pid (SIGKILL after 20 s); the data dir stays for a restart. */
  async stop(signal = "SIGTERM") {
    const child = this.process;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((done) => child.once("exit", done));
    child.kill(signal);
    const timer = setTimeout(() => child.kill("SIGKILL"), 20_000);
    await exited;
    clearTimeout(timer);
  }

  async destroy() {
    await this.stop();
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  /** A request with no client in between (to set things up). */
  async request(method, path, body) {
    const response = await fetch(this.url + path, {
      method, headers: { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: response.status, body: await response.json().catch(() => null) };
  }
}
