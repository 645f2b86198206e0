// Compiled (never run) by `npm run typecheck`: the shipped types describe
// the client, and refuse what the server would refuse.
import {
  Conflict, Rankd, RankdError, sign, type LiveMessage, type SubmitResult, type TopPage,
} from "rankd-client";

async function game(): Promise<void> {
  const rankd = new Rankd({ url: "http://127.0.0.1:7700", token: "rk_gs1_x" });
  const board = rankd.board("arena");
  await board.put({ policy: "sum", windows: ["all", "daily"] });
  const result: SubmitResult = await board.submit({ member: "ann", delta: 3, event_id: "e1" });
  const rank: number | null = result.rank;
  const page: TopPage = await board.top({ window: "daily", limit: 10, offset: 10, minSeq: 4 });
  const first: string | undefined = page.entries[0]?.member;
  const signature: string = await sign("secret", "arena", { member: "ann", score: 1, event_id: "x", ts: 1 });
  try {
    await board.submit({ member: "bob", delta: 1, event_id: "e1", signature });
  } catch (error) {
    if (error instanceof Conflict) {
      const code: string = error.code;
      const status: number = error.status;
      void [code, status];
    } else if (error instanceof RankdError) {
      throw error;
    }
  }
  const feed = board.live({ limit: 5, follow: ["ann"] });
  feed.on("top", (message) => {
    const version: number = message.version;
    const names: string[] = message.top.map((entry) => entry.member);
    void [version, names];
  });
  feed.on("member", (message) => {
    const standing: number | null = message.rank;
    void standing;
  });
  for await (const message of feed) {
    const kind: LiveMessage["type"] = message.type;
    if (message.type === "user.rank.updated") {
      const member: string = message.member;
      void member;
    }
    void kind;
    break;
  }
  void [rank, first];

  // @ts-expect-error: a window the server does not know
  await board.top({ window: "hourly" });
  // @ts-expect-error: a submission needs its member
  await board.submit({ delta: 1 });
  // @ts-expect-error: no such event
  feed.on("tick", () => undefined);
  // @ts-expect-error: a board's policy is one of three
  await board.put({ policy: "max" });
}

void game;
