// The REST half of the client against a real daemon: every operation,
// errors as typed exceptions, signed submissions with the server's bytes.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { after, before, describe, test } from "node:test";

import {
  Board, canonicalBytes, Conflict, ConnectionFailed, Forbidden, formatDouble, InvalidInput,
  NotFound, Rankd, RankdError, sign, Unauthorized,
} from "../src/index.js";
import { Daemon, freePort, python } from "./daemon.js";

const VECTORS = JSON.parse(readFileSync(new URL("../../../protocol/signing-vectors.json",
                                                import.meta.url)));
const SIGNING_SECRET = "a-signing-secret-for-the-js-client-tests";
const hex = (bytes) => Buffer.from(bytes).toString("hex");

describe("a server without credentials", () => {
  const daemon = new Daemon("--signing-secret", SIGNING_SECRET);
  let rankd;
  before(async () => {
    await daemon.start();
    rankd = new Rankd({ url: daemon.url });
  });
  after(() => daemon.destroy());

  test("boards are created, listed, changed and deleted", async () => {
    const board = rankd.board("js-arena");
    assert.ok(board instanceof Board);
    const created = await board.put({ policy: "sum", windows: ["all", "daily"] });
    assert.equal(created.name, "js-arena");
    assert.deepEqual(created.config.windows, ["all", "daily"]);
    const changed = await board.patch({ retain: 3 });
    assert.equal(changed.config.retain, 3);
    const listed = await rankd.boards({ limit: 100 });
    assert.ok(listed.boards.some((b) => b.name === "js-arena"));
    // A change that would drop data needs `discard` (rankd refuses it otherwise).
    await board.submit({ member: "ann", delta: 1 });
    await assert.rejects(board.patch({ windows: ["all"] }), Conflict);
    assert.deepEqual((await board.patch({ windows: ["all"] }, { discard: true })).config.windows,
                     ["all"]);
    await rankd.board("js-gone").put({ policy: "best" });
    await rankd.board("js-gone").delete();
    await assert.rejects(rankd.board("js-gone").get(), NotFound);
  });

  test("submissions and every read give the server's answers", async () => {
    const board = rankd.board("js-reads");
    await board.put({ policy: "sum" });
    const first = await board.submit({ member: "ann", delta: 5, event_id: "e1", label: "Ann" });
    assert.equal(first.score, 5);
    assert.equal(first.rank, 1);
    assert.equal(first.duplicate, false);
    const again = await board.submit({ member: "ann", delta: 5, event_id: "e1", label: "Ann" });
    assert.equal(again.duplicate, true);
    const batch = await board.submitBatch([
      { member: "bob", delta: 9 }, { member: "cy", delta: 1 }, { member: "", delta: 1 }]);
    assert.equal(batch.results.length, 3);
    assert.equal(batch.results[0].score, 9);
    assert.equal(batch.results[2].error.code, "invalid");
    const top = await board.top({ limit: 2 });
    assert.deepEqual(top.entries.map((e) => [e.rank, e.member, e.score]),
                     [[1, "bob", 9], [2, "ann", 5]]);
    assert.equal(top.total, 3);
    const page2 = await board.top({ limit: 2, offset: 2 });
    assert.deepEqual(page2.entries.map((e) => e.member), ["cy"]);
    const ann = await board.member("ann");
    assert.equal(ann.rank, 2);
    assert.equal(ann.label, "Ann");
    const around = await board.around("ann", { above: 1, below: 1 });
    assert.deepEqual(around.entries.map((e) => e.member), ["bob", "ann", "cy"]);
    const ranks = await board.ranks(["cy", "bob", "nobody"]);
    assert.deepEqual(ranks.entries.map((e) => [e.member, e.rank]), [["bob", 1], ["cy", 3]]);
    assert.deepEqual(ranks.missing, ["nobody"]);
    const periods = await board.periods({ window: "all" });
    assert.equal(periods.current, "all");
    await board.removeMember("cy");
    await assert.rejects(board.member("cy"), NotFound);
    assert.equal((await rankd.health()).status, "ok");
  });

  test("names that need escaping reach the server intact", async () => {
    const board = rankd.board("js.names:1");
    await board.put({ policy: "best" });
    await board.submit({ member: "zoë & co/?", score: 3 });
    const seen = await board.member("zoë & co/?");
    assert.equal(seen.member, "zoë & co/?");
    assert.equal((await board.get()).name, "js.names:1");
    await board.submit({ member: "a%2Fb #1", score: 2 });
    assert.equal((await board.top()).entries[1].member, "a%2Fb #1");
  });

  test("errors are typed and carry rankd's code", async () => {
    const board = rankd.board("js-errors");
    await board.put({ policy: "sum" });
    await board.submit({ member: "ann", delta: 1, event_id: "x" });
    const conflict = await board.submit({ member: "bob", delta: 1, event_id: "x" })
      .catch((error) => error);
    assert.ok(conflict instanceof Conflict && conflict instanceof RankdError);
    assert.equal(conflict.code, "event_conflict");
    assert.equal(conflict.status, 409);
    const invalid = await board.submit({ member: "ann", delta: "lots" }).catch((e) => e);
    assert.ok(invalid instanceof InvalidInput);
    assert.equal(invalid.code, "invalid");
    assert.match(invalid.message, /delta/);
    const missing = await rankd.board("js-nothing").top().catch((e) => e);
    assert.ok(missing instanceof NotFound);
    assert.equal(missing.code, "not_found");
    const bad = await board.top({ limit: 0 }).catch((e) => e);
    assert.ok(bad instanceof InvalidInput);
  });

  test("a server that cannot be reached is a ConnectionFailed", async () => {
    const nowhere = new Rankd({ url: `http://127.0.0.1:${await freePort()}`, timeoutMs: 2000 });
    const error = await nowhere.health().catch((e) => e);
    assert.ok(error instanceof ConnectionFailed);
    assert.equal(error.code, "connection");
  });

  test("signed submissions are accepted, and refused when tampered with", async () => {
    const board = rankd.board("js-signed");
    await board.put({ policy: "best", signed: true });
    const answer = await board.submitSigned(SIGNING_SECRET,
                                            { member: "ann", score: 1234.5, event_id: "s1" });
    assert.equal(answer.score, 1234.5);
    const event = { member: "bob", score: 10, event_id: "s2", ts: Date.now() / 1000,
                    label: "Bob" };
    const signature = await sign(SIGNING_SECRET, board.name, event);
    const tampered = await board.submit({ ...event, score: 11, signature }).catch((e) => e);
    assert.ok(tampered instanceof Unauthorized, String(tampered));
    const unsigned = await board.submit({ member: "cy", score: 1 }).catch((e) => e);
    assert.ok(unsigned instanceof RankdError);
    assert.equal((await board.submit({ ...event, signature })).score, 10);
  });
});

describe("a server with credentials", () => {
  const key = `rk_js1_${randomBytes(24).toString("base64url")}`;
  const reader = `rk_js2_${randomBytes(24).toString("base64url")}`;
  const entry = (id, value, scopes) =>
    `${id}:${createHash("sha256").update(value).digest("hex")}:${scopes}`;
  const daemon = new Daemon("--api-keys",
                            `${entry("js1", key, "read+write+admin")},${entry("js2", reader, "read")}`);
  before(() => daemon.start());
  after(() => daemon.destroy());

  test("the token is sent; no token or a weaker one is refused", async () => {
    const admin = new Rankd({ url: daemon.url, token: key });
    await admin.board("js-private").put({ policy: "sum" });
    await admin.board("js-private").submit({ member: "ann", delta: 1 });
    assert.equal((await new Rankd({ url: daemon.url, token: reader }).board("js-private")
      .top()).entries[0].member, "ann");
    await assert.rejects(new Rankd({ url: daemon.url }).board("js-private").top(), Unauthorized);
    await assert.rejects(new Rankd({ url: daemon.url, token: reader }).board("js-private")
      .submit({ member: "bob", delta: 1 }), Forbidden);
    const joined = await admin.realtimeToken();
    assert.ok(joined.token.length > 20 && joined.expires_in > 0);
  });
});

test("the signing vectors: the same bytes and signatures as the server", async () => {
  for (const vector of VECTORS.vectors) {
    assert.equal(hex(canonicalBytes(vector.board, vector.event)), vector.canonical_hex, vector.name);
    assert.equal(await sign(VECTORS.secret, vector.board, vector.event), vector.signature,
                 vector.name);
  }
});

test("formatDouble writes every float64 as Python's '%.17g' does", () => {
  // Random bit patterns (every exponent), and the edges.
  const values = [0, -0, 1, -1, 0.1, 1e-5, 1e-4, 1e16, 1e17, 123456789012345680000, 5e-324,
                  1.7976931348623157e308, 2 ** 53, 2 ** 53 + 2, 0.5, 1795305600.25, -0.5];
  const view = new DataView(new ArrayBuffer(8));
  for (let i = 0; i < 3000; i += 1) {
    view.setUint32(0, (Math.random() * 2 ** 32) >>> 0);
    view.setUint32(4, (Math.random() * 2 ** 32) >>> 0);
    const value = view.getFloat64(0);
    if (Number.isFinite(value)) values.push(value);
  }
  for (let i = 0; i < 1000; i += 1) values.push(Math.round(Math.random() * 1e6) / 100);
  const script = "import sys, struct\n" +
    "for line in sys.stdin.read().split():\n" +
    "    print('%.17g' % struct.unpack('>d', bytes.fromhex(line))[0])\n";
  const input = values.map((value) => {
    view.setFloat64(0, value);
    return hex(new Uint8Array(view.buffer));
  }).join("\n");
  const expected = execFileSync(python(), ["-c", script], { input }).toString().trim().split("\n");
  const mismatches = values.map((value, i) => [value, formatDouble(value), expected[i]])
    .filter(([, mine, theirs]) => mine !== theirs);
  assert.deepEqual(mismatches.slice(0, 5), []);
  assert.throws(() => formatDouble(NaN), RangeError);
  assert.throws(() => formatDouble(Infinity), RangeError);
});
