// The live feed against a real daemon, over WebSocket (Node's, behind
// --experimental-websocket before Node 22) and over Server-Sent Events.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { Rankd } from "../src/index.js";
import { Daemon } from "./daemon.js";

const HAS_WEBSOCKET = typeof WebSocket === "function";

/** The first message of `feed` for which `check` holds (within `ms`). */
function next(feed, type, check = () => true, ms = 10_000) {
  return new Promise((done, fail) => {
    const timer = setTimeout(() => { feed.off(type, listener); fail(new Error(`no ${type} in ${ms} ms`)); }, ms);
    const listener = (message) => {
      if (!check(message)) return;
      clearTimeout(timer);
      feed.off(type, listener);
      done(message);
    };
    feed.on(type, listener);
  });
}

const names = (message) => message.top.map((entry) => entry.member);

/** Once `feed` is in `state` (at once if it is). */
const inState = (feed, state, ms = 10_000) =>
  (feed.state === state ? Promise.resolve(state) : next(feed, "state", (s) => s === state, ms));

for (const transport of ["websocket", "sse"]) {
  describe(`the live feed over ${transport}`, { skip: transport === "websocket" && !HAS_WEBSOCKET
                                                  && "no WebSocket in this Node" }, () => {
    const daemon = new Daemon("--live-interval", "0.05");
    let rankd;
    before(async () => {
      await daemon.start();
      rankd = new Rankd({ url: daemon.url });
      await rankd.board("arena").put({ policy: "sum", windows: ["all", "daily"] });
      await rankd.board("arena").submitBatch(
        Array.from({ length: 12 }, (_, i) => ({ member: `p${i + 1}`, delta: 10 * (i + 1) })));
    });
    after(() => daemon.destroy());

    test("the top arrives at once and then as it changes", async () => {
      const feed = rankd.board("arena").live({ limit: 3, transport });
      try {
        const first = await next(feed, "top");
        assert.deepEqual(names(first), ["p12", "p11", "p10"]);
        assert.equal(feed.state, "live");
        assert.equal(feed.transport, transport);
        // Listening before the write: its push may arrive before its response.
        const movedSoon = next(feed, "top", (m) => names(m)[0] === "p1");
        await rankd.board("arena").submit({ member: "p1", delta: 500 });
        const moved = await movedSoon;
        assert.ok(moved.version > first.version);
      } finally {
        feed.close();
      }
      assert.equal(feed.state, "closed");
    });

    test("followed members: their standings, followed and unfollowed on the way", async () => {
      const feed = rankd.board("arena").live({ limit: 1, transport, follow: ["p5"] });
      try {
        const p5 = await next(feed, "member", (m) => m.member === "p5");
        assert.ok(p5.rank > 1);
        feed.follow(["p7", "nobody"]);
        const nobody = await next(feed, "member", (m) => m.member === "nobody");
        assert.equal(nobody.rank, null);
        feed.unfollow(["p5"]);
        await new Promise((done) => setTimeout(done, 300));
        const seen = [];
        feed.on("member", (m) => seen.push(m.member));
        const p7Moved = next(feed, "member", (m) => m.member === "p7" && m.rank <= 2);
        await rankd.board("arena").submit({ member: "p7", delta: 1000 });
        await rankd.board("arena").submit({ member: "p5", delta: 2000 });
        await p7Moved;
        await new Promise((done) => setTimeout(done, 300));
        assert.ok(!seen.includes("p5"), `p5 was unfollowed: ${seen}`);
      } finally {
        feed.close();
      }
    });

    test("members followed before the feed opened are followed", async () => {
      const feed = rankd.board("arena").live({ limit: 1, transport });
      feed.follow(["p3"]); // while it connects
      try {
        const p3 = await next(feed, "member", (m) => m.member === "p3");
        assert.ok(p3.rank >= 1);
      } finally {
        feed.close();
      }
    });

    test("as an async iterator", async () => {
      const feed = rankd.board("arena").live({ limit: 2, transport, follow: ["p2"] });
      const seen = new Set();
      for await (const message of feed) {
        seen.add(message.type);
        if (seen.size === 2) break; // ends the feed
      }
      assert.deepEqual([...seen].sort(), ["leaderboard.updated", "user.rank.updated"]);
      assert.equal(feed.state, "closed");
    });
  });
}

describe("reconnection", () => {
  const daemon = new Daemon("--live-interval", "0.05");
  before(() => daemon.start());
  after(() => daemon.destroy());

  for (const transport of ["websocket", "sse"]) {
    test(`over ${transport}: a restarted server is reconnected to, the view resumed, what ` +
         "was missed re-read", { skip: transport === "websocket" && !HAS_WEBSOCKET }, async () => {
      const rankd = new Rankd({ url: daemon.url });
      const board = rankd.board(`again-${transport}`);
      await board.put({ policy: "sum" });
      await board.submit({ member: "ann", delta: 5 });
      const feed = board.live({ limit: 5, transport, follow: ["ann"] });
      const states = [];
      feed.on("state", (state) => states.push(state));
      try {
        const first = await next(feed, "top");
        assert.deepEqual(names(first), ["ann"]);
        await daemon.stop();
        await inState(feed, "reconnecting");
        const resynced = next(feed, "resync", () => true, 40_000);
        await daemon.start();
        // Written while the feed is away: shown once it is back.
        const backSoon = next(feed, "top", (m) => names(m).includes("bob"), 40_000);
        await board.submit({ member: "bob", delta: 9 });
        const back = await backSoon;
        assert.deepEqual(names(back), ["bob", "ann"]);
        await resynced;
        assert.ok(back.version >= first.version, "versions never go back");
        // The followed member is followed again on the new connection.
        const annSoon = next(feed, "member", (m) => m.member === "ann" && m.rank === 1, 20_000);
        await board.submit({ member: "ann", delta: 100 });
        const ann = await annSoon;
        assert.equal(ann.score, 105);
        assert.equal(feed.stats.reconnects, 1);
        assert.ok(states.includes("reconnecting") && states.at(-1) === "live", String(states));
      } finally {
        feed.close();
      }
    });
  }

  test("a feed only listened to keeps no backlog; an iteration keeps a bounded one", () => {
    const feed = new Rankd({ url: daemon.url }).board("backlog")
      .live({ transport: "sse", autoStart: false });
    let heard = 0;
    feed.on("top", () => { heard += 1; });
    for (let version = 1; version <= 3000; version += 1) {
      feed.deliver({ type: "leaderboard.updated", version, top: [] });
    }
    assert.equal(heard, 3000);
    assert.equal(feed.queue.length, 0);
    const iteration = feed[Symbol.asyncIterator]();
    for (let version = 3001; version <= 6000; version += 1) {
      feed.deliver({ type: "leaderboard.updated", version, top: [] });
    }
    assert.equal(feed.queue.length, 1000);
    return iteration.next().then(({ value }) => {
      assert.equal(value.version, 5001); // the oldest kept
      feed.close();
    });
  });

  test("a message older than what was shown is dropped", async () => {
    const rankd = new Rankd({ url: daemon.url });
    const board = rankd.board("stale");
    await board.put({ policy: "sum" });
    await board.submit({ member: "ann", delta: 1 });
    const feed = board.live({ transport: "sse", autoStart: false });
    const shown = [];
    feed.on("top", (message) => shown.push(message.version));
    feed.deliver({ type: "leaderboard.updated", version: 7, top: [] });
    feed.deliver({ type: "leaderboard.updated", version: 5, top: [] });
    feed.deliver({ type: "leaderboard.updated", version: 8, top: [] });
    assert.deepEqual(shown, [7, 8]);
    assert.equal(feed.stats.stale, 1);
    feed.close();
  });
});

describe("a server with credentials", () => {
  const key = `rk_live1_${randomBytes(24).toString("base64url")}`;
  const digest = createHash("sha256").update(key).digest("hex");
  const daemon = new Daemon("--live-interval", "0.05", "--api-keys", `live1:${digest}:read+admin`);
  before(() => daemon.start());
  after(() => daemon.destroy());

  for (const transport of ["websocket", "sse"]) {
    test(`over ${transport}: the feed joins with a join token`,
         { skip: transport === "websocket" && !HAS_WEBSOCKET }, async () => {
      const rankd = new Rankd({ url: daemon.url, token: key });
      await rankd.board(`private-${transport}`).put({ policy: "sum" });
      const feed = rankd.board(`private-${transport}`).live({ transport });
      try {
        const first = await next(feed, "top");
        assert.deepEqual(first.top, []);
      } finally {
        feed.close();
      }
      // Without a credential the feed is refused, and keeps trying.
      const anonymous = new Rankd({ url: daemon.url }).board(`private-${transport}`)
        .live({ transport });
      try {
        const error = await next(anonymous, "error");
        assert.equal(error.code, "unauthorized");
        assert.notEqual(anonymous.state, "live");
      } finally {
        anonymous.close();
      }
    });
  }
});
