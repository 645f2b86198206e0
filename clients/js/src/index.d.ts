// Types of rankd's JavaScript client (index.js).  The request and answer
// shapes are in api.d.ts, generated from the server's OpenAPI document.

import type {
  AroundPage, BatchResult, BoardConfig, BoardInfo, BoardList, ClusterStatus, Entry, Health,
  JoinToken, PeriodsResult, Ready, RanksResult, Standing, SubmitRequest, SubmitResult, TopPage,
} from "./api.js";

export type * from "./api.js";

/** rankd's error codes (the `code` of every error body). */
export type ErrorCode =
  | "bad_request" | "not_found" | "method_not_allowed" | "conflict" | "event_conflict"
  | "too_large" | "unsupported_media_type" | "invalid" | "guard" | "read_only" | "storage"
  | "misdirected" | "not_primary" | "unacknowledged" | "unavailable" | "unauthorized"
  | "forbidden" | "rate_limited" | "too_many_connections";

/** An error rankd answered (or a request that never got an answer). */
export class RankdError extends Error {
  /** rankd's error code, `connection` when no answer came, or `http_<status>`. */
  readonly code: ErrorCode | "connection" | `http_${number}`;
  /** The HTTP status (0 when no answer came). */
  readonly status: number;
  /** The error's JSON body, as rankd sent it. */
  readonly body: unknown;
}
/** `bad_request`, `invalid`, `guard`, `too_large`, ...: fix the request. */
export class InvalidInput extends RankdError {}
export class NotFound extends RankdError {}
/** `conflict`, or `event_conflict` (an event id reused for another submission). */
export class Conflict extends RankdError {}
export class Unauthorized extends RankdError {}
export class Forbidden extends RankdError {}
export class RateLimited extends RankdError {
  /** Seconds the server asked to wait, if it said. */
  readonly retryAfter: number | null;
}
/** The server cannot take the request now; try again. */
export class Unavailable extends RankdError {}
/** The write may or may not have been applied: resubmit it with the same event id. */
export class Unacknowledged extends Unavailable {}
/** The server could not be reached, or did not answer in time. */
export class ConnectionFailed extends RankdError {}

/** A float64 as C's printf("%.17g") writes it. */
export function formatDouble(value: number): string;
/** The bytes a signed submission's signature covers (docs/security.md). */
export function canonicalBytes(board: string, event: SubmitRequest): Uint8Array;
/**
 * `v2=` and the hex HMAC-SHA256 of the canonical bytes: the `signature` of a
 * submission to a `signed` board.  Sign on a game server, never in a browser.
 */
export function sign(secret: string, board: string, event: SubmitRequest): Promise<string>;
/** The delay before reconnection attempt `attempt` (0, 1, ...), in ms. */
export function backoff(attempt: number): number;

export interface ReadOptions {
  window?: "all" | "daily" | "weekly" | "monthly";
  /** A closed period's id (e.g. `2026-11-25`, `2026-W48`, `2026-11`). */
  period?: string;
  /** On a cluster: wait until this node applied the write that answered this `seq`. */
  minSeq?: number;
}

export interface RankdOptions {
  /** The server's base URL (default: the page's origin). */
  url?: string;
  /** An API key or JWT, sent as a bearer token. */
  token?: string;
  /** Per request (default 10,000). */
  timeoutMs?: number;
  fetch?: typeof fetch;
  /** A WebSocket class (Node < 22: e.g. the `ws` package's), or null for none. */
  WebSocket?: unknown;
  EventSource?: unknown;
  /**
   * Session consistency (default true): each read of a board carries the log
   * position of this client's last write to it as `minSeq`, so on a cluster a
   * follower answers once it applied that write.  False: read what the node has.
   */
  readYourWrites?: boolean;
}

/** A write's position in its board group's log (a cluster's answers carry it). */
export interface LogPosition {
  epoch: number;
  seq: number;
}

export class Rankd {
  constructor(options?: RankdOptions);
  readonly url: string;
  token: string | null;
  readYourWrites: boolean;
  /** Board name -> the position of this client's last write to it. */
  readonly positions: Map<string, LogPosition>;
  request<T = unknown>(method: string, path: string, options?: {
    query?: Record<string, unknown>; body?: unknown; signal?: AbortSignal;
  }): Promise<T>;
  health(): Promise<Health>;
  ready(): Promise<Ready>;
  boards(options?: { limit?: number; after?: string }): Promise<BoardList>;
  board(name: string): Board;
  realtimeToken(): Promise<JoinToken>;
  me(board: string, options?: ReadOptions): Promise<Standing>;
  cluster(): Promise<ClusterStatus>;
  openapi(): Promise<Record<string, unknown>>;
}

export class Board {
  readonly client: Rankd;
  readonly name: string;
  get(options?: { minSeq?: number }): Promise<BoardInfo>;
  put(config?: BoardConfig, options?: { discard?: boolean }): Promise<BoardInfo>;
  patch(config: BoardConfig, options?: { discard?: boolean }): Promise<BoardInfo>;
  delete(): Promise<Record<string, never>>;
  submit(event: SubmitRequest): Promise<SubmitResult>;
  submitBatch(events: SubmitRequest[]): Promise<BatchResult>;
  /** Sign (`ts` defaults to now) and submit, to a `signed` board. */
  submitSigned(secret: string, event: SubmitRequest): Promise<SubmitResult>;
  top(options?: ReadOptions & { limit?: number; offset?: number }): Promise<TopPage>;
  member(member: string, options?: ReadOptions): Promise<Standing>;
  around(member: string, options?: ReadOptions & { above?: number; below?: number }
         ): Promise<AroundPage>;
  ranks(members: string[], options?: ReadOptions): Promise<RanksResult>;
  periods(options?: { window?: string }): Promise<PeriodsResult>;
  removeMember(member: string): Promise<Record<string, never>>;
  live(options?: LiveOptions): LiveFeed;
}

export interface LiveOptions {
  window?: "all" | "daily" | "weekly" | "monthly";
  /** Rows of the top, 1..100 (default 10). */
  limit?: number;
  /** Members whose standings to push. */
  follow?: string[];
  /** `auto` (WebSocket, else Server-Sent Events), or one of them only. */
  transport?: "auto" | "websocket" | "sse";
  /** How often a quiet WebSocket is pinged (default 15,000 ms). */
  heartbeatMs?: number;
  /** Connect at once (default true). */
  autoStart?: boolean;
}

/** `leaderboard.updated`: the top of the window, as it is now. */
export interface TopMessage {
  type: "leaderboard.updated";
  board: string;
  window: string;
  period: string;
  version: number;
  top: Entry[];
  ts: number;
  /** `rest` when re-read after a reconnection. */
  source?: "rest";
}

/** `user.rank.updated`: a followed member's standing (rank null: no score). */
export interface MemberMessage {
  type: "user.rank.updated";
  board: string;
  window: string;
  member: string;
  score: number | null;
  rank: number | null;
  version: number;
  ts: number;
}

export type LiveMessage = TopMessage | MemberMessage;
export type LiveState = "connecting" | "live" | "reconnecting" | "closed";

export class LiveFeed implements AsyncIterable<LiveMessage> {
  readonly state: LiveState;
  readonly transport: "websocket" | "sse";
  /** The version of the last top delivered. */
  readonly version: number;
  readonly stats: { stale: number; reconnects: number };
  on(type: "top", listener: (message: TopMessage) => void): this;
  on(type: "member", listener: (message: MemberMessage) => void): this;
  on(type: "state", listener: (state: LiveState) => void): this;
  on(type: "resync", listener: (info: { version: number }) => void): this;
  on(type: "error", listener: (error: RankdError | Error) => void): this;
  off(type: string, listener: (...args: never[]) => void): this;
  follow(members: string[]): void;
  unfollow(members: string[]): void;
  start(): void;
  close(): void;
  [Symbol.asyncIterator](): AsyncIterator<LiveMessage>;
}
