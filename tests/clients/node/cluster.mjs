// A leaderboard over many slots through a Redis Cluster client against a
// rankd cluster (argv: "io" for ioredis Cluster or "node" for node-redis
// createCluster, then one node's RESP port, then the number of boards);
// prints what it read as JSON for tests/cluster/test_cluster_resp.py to check.
import { Cluster } from "ioredis";
import { createCluster } from "redis";

const [which, port, boards] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
const keys = Array.from({ length: boards }, (_, i) => `lb:${which}:${i}`);
const out = { added: [], scores: [], tops: [], tagged: null };

if (which === "io") {
  const cluster = new Cluster([{ host: "127.0.0.1", port }], { maxRedirections: 4 });
  for (const [i, key] of keys.entries()) out.added.push(await cluster.zadd(key, i, "alice", i + 1, "bob"));
  await Promise.all(keys.map((key) => cluster.zincrby(key, 10, "alice")));
  // (An ioredis pipeline must stay on one node: keys of one hash tag.)
  const pipeline = cluster.pipeline();
  for (let i = 0; i < 20; i++) pipeline.zincrby("{pipe}:lb", 1, `p${i % 4}`);
  out.pipelined = (await pipeline.exec()).map(([error, value]) => (error ? String(error) : value));
  for (const key of keys) out.scores.push(Number(await cluster.zscore(key, "alice")));
  for (const key of keys) out.tops.push(await cluster.zrevrange(key, 0, 0));
  await cluster.zadd("{season}:daily", 5, "x");
  await cluster.zadd("{season}:weekly", 7, "x");
  out.tagged = await cluster.zunionstore("{season}:all", 2, "{season}:daily", "{season}:weekly");
  out.nodes = cluster.nodes("master").length;
  await cluster.quit();
} else {
  const cluster = createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${port}` }] });
  await cluster.connect();
  for (const [i, key] of keys.entries()) {
    out.added.push(await cluster.zAdd(key, [{ score: i, value: "alice" }, { score: i + 1, value: "bob" }]));
  }
  await Promise.all(keys.map((key) => cluster.zIncrBy(key, 10, "alice")));
  for (const key of keys) out.scores.push(await cluster.zScore(key, "alice"));
  for (const key of keys) out.tops.push(await cluster.zRange(key, 0, 0, { REV: true }));
  await cluster.zAdd("{season}:daily", { score: 5, value: "x" });
  await cluster.zAdd("{season}:weekly", { score: 7, value: "x" });
  out.tagged = await cluster.zUnionStore("{season}:all", ["{season}:daily", "{season}:weekly"]);
  out.nodes = cluster.masters.length;
  await cluster.quit();
}
console.log(JSON.stringify(out));
