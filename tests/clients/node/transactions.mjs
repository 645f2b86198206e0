// Transactions of a Node client against rankd's RESP port (tests/test_resp_transactions.py):
// daily, weekly and all-time boards updated together by MULTI/EXEC, a transaction with
// an unknown command (EXECABORT: nothing applied), and WATCH aborting EXEC.
// Usage: node transactions.mjs PORT io|node-redis; prints a JSON summary.
const [port, kind] = process.argv.slice(2);
const boards = ["tx-daily", "tx-weekly", "tx-all"];
const out = {};

async function withIoredis() {
  const { default: Redis } = await import("ioredis");
  const client = new Redis({ port: Number(port), lazyConnect: true });
  const other = new Redis({ port: Number(port), lazyConnect: true });
  await client.connect();
  await other.connect();
  try {
    let multi = client.multi();
    for (const board of boards) multi = multi.zincrby(board, 10, "alice");
    out.applied = (await multi.exec()).map(([error, value]) => (error ? String(error) : value));
    try {
      let failing = client.multi();
      for (const board of boards) failing = failing.zincrby(board, 5, "alice");
      await failing.call("NOSUCHCOMMAND", "x").exec();
      out.aborted = "no error";
    } catch (error) {
      out.aborted = String(error.message);
    }
    await client.watch("tx-all");
    await other.zadd("tx-all", 1, "bob");
    let watched = client.multi();
    for (const board of boards) watched = watched.zincrby(board, 7, "alice");
    out.watched = await watched.exec();
    out.scores = await Promise.all(boards.map((board) => client.zscore(board, "alice")));
  } finally {
    client.disconnect();
    other.disconnect();
  }
}

async function withNodeRedis() {
  const { createClient } = await import("redis");
  const client = createClient({ socket: { port: Number(port) } });
  const other = createClient({ socket: { port: Number(port) } });
  await client.connect();
  await other.connect();
  try {
    let multi = client.multi();
    for (const board of boards) multi = multi.zIncrBy(board, 10, "alice");
    out.applied = (await multi.exec()).map(String);
    try {
      let failing = client.multi();
      for (const board of boards) failing = failing.zIncrBy(board, 5, "alice");
      await failing.addCommand(["NOSUCHCOMMAND", "x"]).exec();
      out.aborted = "no error";
    } catch (error) {
      out.aborted = String(error.message);
    }
    // WATCH needs a connection of its own in node-redis 4 (isolated execution).
    out.watched = await client.executeIsolated(async (isolated) => {
      await isolated.watch("tx-all");
      await other.zAdd("tx-all", { score: 1, value: "bob" });
      let watched = isolated.multi();
      for (const board of boards) watched = watched.zIncrBy(board, 7, "alice");
      try {
        return await watched.exec();
      } catch (error) {
        return error.constructor.name;
      }
    });
    out.scores = await Promise.all(boards.map((board) => client.zScore(board, "alice")));
  } finally {
    await client.quit();
    await other.quit();
  }
}

await (kind === "io" ? withIoredis() : withNodeRedis());
console.log(JSON.stringify(out));
