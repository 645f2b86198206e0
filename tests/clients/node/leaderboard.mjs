// A leaderboard through ioredis against rankd's RESP port (argv: port, key);
// prints what it read as JSON for tests/test_resp_clients.py to check.
import Redis from "ioredis";

const [port, key] = [Number(process.argv[2]), process.argv[3]];
const redis = new Redis({ host: "127.0.0.1", port, lazyConnect: true, maxRetriesPerRequest: 1 });
await redis.connect();
const out = {};
out.added = await redis.zadd(key, 100, "alice", 250, "bob", 175, "carol");
out.incremented = await redis.zincrby(key, 100, "alice");
out.top = await redis.zrevrange(key, 0, 2, "WITHSCORES");
out.rankOfBob = await redis.zrevrank(key, "bob");
out.scoreOfCarol = await redis.zscore(key, "carol");
out.card = await redis.zcard(key);
out.countAbove = await redis.zcount(key, 180, "+inf");
out.removed = await redis.zrem(key, "carol");
const pipeline = redis.pipeline();
for (let i = 0; i < 100; i++) pipeline.zincrby(key, 1, `p${i % 10}`);
out.pipelined = (await pipeline.exec()).map(([error, value]) => (error ? String(error) : value));
out.byScore = await redis.zrangebyscore(key, "(9", "10", "LIMIT", 0, 3);
out.deleted = await redis.del(key);
out.exists = await redis.exists(key);
console.log(JSON.stringify(out));
await redis.quit();
