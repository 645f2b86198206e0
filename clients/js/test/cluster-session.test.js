// Read-your-writes on a cluster: a client of a follower writes (the node
// forwards the write to the primary) and its next read on the follower sees
// it, because the client sends its last write's position as `min_seq`.
// Driven by tests/cluster/test_client_sessions.py, which starts a two-node
// cluster on Postgres and names its nodes in RANKD_CLUSTER_FOLLOWER and
// RANKD_CLUSTER_PRIMARY; without them (`npm test` alone) it has no tests.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Rankd } from "../src/index.js";

const FOLLOWER = process.env.RANKD_CLUSTER_FOLLOWER;
const PRIMARY = process.env.RANKD_CLUSTER_PRIMARY;

/** A fetch that records every URL it is asked for. */
function recording(urls) {
  return (url, init) => {
    urls.push(String(url));
    return fetch(url, init);
  };
}

if (FOLLOWER && PRIMARY) {
  describe("a client of a cluster's follower", () => {
    test("reads its own writes at once", async () => {
      const urls = [];
      const rankd = new Rankd({ url: FOLLOWER, fetch: recording(urls) });
      const board = rankd.board("js-ryw");
      for (let n = 0; n < 30; n += 1) {
        const written = await board.submit({ member: `m${n}`, delta: n + 1, event_id: `e${n}` });
        assert.equal(typeof written.seq, "number");
        assert.equal((await board.member(`m${n}`)).score, n + 1);
        assert.equal((await board.top({ limit: 100 })).total, n + 1);
        assert.deepEqual(rankd.positions.get("js-ryw"), { epoch: written.epoch, seq: written.seq });
      }
      const { results } = await board.submitBatch(
        Array.from({ length: 10 }, (_, n) => ({ member: `b${n}`, delta: 1 })));
      const last = Math.max(...results.map((result) => result.seq));
      assert.equal(rankd.positions.get("js-ryw").seq, last);
      const ranks = await board.ranks(Array.from({ length: 10 }, (_, n) => `b${n}`));
      assert.deepEqual(ranks.missing, []);
      assert.ok(urls.at(-1).endsWith(`?min_seq=${last}`), urls.at(-1));
      // A position the caller gives wins over the session's.
      await board.top({ minSeq: 1 });
      assert.ok(urls.at(-1).endsWith("?min_seq=1"), urls.at(-1));
    });

    test("sends no position when asked not to", async () => {
      const urls = [];
      const rankd = new Rankd({ url: FOLLOWER, fetch: recording(urls), readYourWrites: false });
      const board = rankd.board("js-ryw");
      await board.submit({ member: "late", delta: 1 });
      await board.get();
      await board.top();
      assert.ok(urls.slice(1).every((url) => !url.includes("min_seq")), urls.join("\n"));
      assert.equal(rankd.positions.size, 0);
    });
  });
}
