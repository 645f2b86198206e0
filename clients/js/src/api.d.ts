// The rankd REST API's schemas (v0.1.0), generated from its OpenAPI
// document by `python -m rankd.docs`; do not edit by hand.

/** A board's configuration.  In a request every field is optional (defaults shown); a response has them all.  `min_score` must not exceed `max_score`.  `order` and `tie_break` cannot change once the board has members (409). */
export interface BoardConfig {
  order?: "desc" | "asc";
  /** `best` keeps the best score submitted, `sum` adds deltas, `latest` keeps the last score. */
  policy?: "sum" | "best" | "latest";
  /** How equal scores rank: `first` who got there first, `member` by member from A to Z, `member_desc` from Z to A (Redis's ZREVRANGE order on a `desc` board). */
  tie_break?: "first" | "member" | "member_desc";
  windows?: Array<"all" | "daily" | "weekly" | "monthly">;
  /** Closed periods kept per window. */
  retain?: number;
  min_score?: number | null;
  max_score?: number | null;
  /** The most one submission may change a score. */
  max_delta?: number | null;
  /** Every submission must carry an HMAC-SHA256 `signature`, an `event_id` and a `ts`. */
  signed?: boolean;
  /** On a cluster, `all` keeps the board's group on every live node (docs/cluster.md); null: the cluster's `--replicas`.  In a response only when set. */
  replicas?: "all" | null;
  /** When the board is deleted, milliseconds since 1970 (UTC); null: never (Redis's `PEXPIREAT`, `TTL`: docs/redis.md).  In a request it must be in the future (422).  Once it passes the board answers 404 everywhere and a write to it needs a new board. */
  expires_at_ms?: number | null;
}

export interface BoardInfo {
  /** A board name (1 to 512 bytes of UTF-8 text without control or invisible formatting characters, not . or ..). */
  name: string;
  config: Required<BoardConfig>;
  /** Members in the current period of each window. */
  members: Record<string, number>;
  /** The board's version, bumped by every change to it. */
  version: number;
  /** When the board last changed, Unix seconds. */
  updated_at: number;
}

/** A page of boards, by name. */
export interface BoardList {
  boards: Array<BoardInfo>;
  /** Pass as `after` for the next page; null on the last. */
  next: string | null;
}

/** One score submission: `score` on `best` and `latest` boards, `delta` on `sum` boards (the other one absent or null).  Numbers must be finite; integers at most 2**53 in magnitude. */
export interface SubmitRequest {
  /** A member name: 1 to 256 bytes of UTF-8. */
  member: string;
  score?: number | null;
  delta?: number | null;
  event_id?: string | null;
  ts?: number | null;
  label?: string | null;
  /** On `signed` boards: `v2=` and the hex HMAC-SHA256 of the submission's fields, each length-prefixed (board, member, kind, value, event_id, ts, label; the exact bytes and test vectors are in docs/security.md). */
  signature?: string;
}

/** The outcome of one submission in the board's primary window (`all` if kept, else the first window). */
export interface SubmitResult {
  /** A member name: 1 to 256 bytes of UTF-8. */
  member: string;
  /** The member's score now, in the board's primary window. */
  score: number;
  rank: number | null;
  previous: number | null;
  changed: boolean;
  duplicate: boolean;
  event_id: string | null;
  /** On a cluster node: the position of the board group's log this write is at or before.  Pass it as `min_seq` to a read on any node to see this write. */
  seq?: number;
  /** On a cluster node: the epoch of the primary that wrote it. */
  epoch?: number;
}

export interface BatchRequest {
  /** At most 10000 events (413 beyond).  An event that is not a valid submission gets an error in its slot of the result; the others are applied. */
  events: Array<SubmitRequest>;
}

export interface BatchResult {
  /** One result or error per event, in order. */
  results: Array<SubmitResult | BatchItemError>;
}

/** Why one event of a batch was refused. */
export interface BatchItemError {
  error: {
    code: "invalid" | "guard" | "not_found" | "event_conflict";
    message: string;
  };
}

/** One row of a leaderboard: unique rank (1 is the top). */
export interface Entry {
  rank: number;
  /** A member name: 1 to 256 bytes of UTF-8. */
  member: string;
  score: number;
  label: string | null;
}

export interface TopPage {
  entries: Array<Entry>;
  /** Members in the window's period. */
  total: number;
  window: "all" | "daily" | "weekly" | "monthly";
  /** A period id of the window: `all`, a day `2026-11-22`, an ISO week `2026-W47` or a month `2026-11` (UTC). */
  period: string;
  /** The board's version, bumped by every change to it. */
  version: number;
  /** When the board last changed, Unix seconds. */
  updated_at: number;
}

export interface Standing {
  /** A member name: 1 to 256 bytes of UTF-8. */
  member: string;
  score: number;
  /** Unique rank (ties broken by the board's tie_break). */
  rank: number;
  /** Ties share a rank: 1, 1, 3. */
  competition_rank: number;
  /** Ties share a rank: 1, 1, 2. */
  dense_rank: number;
  percentile: number;
  total: number;
  label: string | null;
  window: "all" | "daily" | "weekly" | "monthly";
  /** A period id of the window: `all`, a day `2026-11-22`, an ISO week `2026-W47` or a month `2026-11` (UTC). */
  period: string;
  /** The board's version, bumped by every change to it. */
  version: number;
}

export interface AroundPage {
  /** The member and its neighbours, in rank order. */
  entries: Array<Entry>;
}

export interface RanksRequest {
  /** At most 1000 members (413 beyond). */
  members: Array<string>;
}

/** `rank` on the whole board, `list_rank` in the list. */
export interface RankEntry {
  rank: number;
  list_rank: number;
  /** A member name: 1 to 256 bytes of UTF-8. */
  member: string;
  score: number;
  label: string | null;
}

export interface RanksResult {
  entries: Array<RankEntry>;
  /** Requested members without a score in the period. */
  missing: Array<string>;
  window: "all" | "daily" | "weekly" | "monthly";
  /** A period id of the window: `all`, a day `2026-11-22`, an ISO week `2026-W47` or a month `2026-11` (UTC). */
  period: string;
}

export interface PeriodsResult {
  window: "all" | "daily" | "weekly" | "monthly";
  /** A period id of the window: `all`, a day `2026-11-22`, an ISO week `2026-W47` or a month `2026-11` (UTC). */
  current: string;
  /** Closed periods still queryable, newest first. */
  retained: Array<string>;
}

export interface Health {
  status: "ok" | "recovering";
}

/** Every error: a stable machine-readable code and a message for people.  `bad_request` 400, `not_found` 404, `method_not_allowed` 405, `conflict` 409, `event_conflict` 409, `too_large` 413, `unsupported_media_type` 415, `invalid` 422, `guard` 422, `read_only` 503, `storage` 503, `misdirected` 421, `not_primary` 421, `unacknowledged` 503, `unavailable` 503, `unauthorized` 401, `forbidden` 403, `rate_limited` 429, `too_many_connections` 429. */
export interface Error {
  error: {
    code: "bad_request" | "not_found" | "method_not_allowed" | "conflict" | "event_conflict" | "too_large" | "unsupported_media_type" | "invalid" | "guard" | "read_only" | "storage" | "misdirected" | "not_primary" | "unacknowledged" | "unavailable" | "unauthorized" | "forbidden" | "rate_limited" | "too_many_connections";
    message: string;
  };
}

/** A short-lived `read` token for the live feed's query string (`?token=`). */
export interface JoinToken {
  token: string;
  expires_in: number;
}

export interface Ready {
  ready: boolean;
  checks: Record<string, boolean>;
  degraded: Record<string, boolean>;
}

export interface SnapshotInfo {
  position: number;
  path: string;
  bytes: number;
  seconds: number;
}

export interface Digest {
  digest: string;
}

/** `nodes`: each node's id, advertised address, whether it is alive and how long it has been silent.  `groups`: each board group with a log, its `epoch`, `primary`, `lease_seconds_left`, `last_seq` and every live follower's `applied` position and `lag`.  `this_node`: the groups this node writes and follows. */
export interface ClusterStatus {
  nodes: Array<Record<string, unknown>>;
  groups: Array<Record<string, unknown>>;
  this_node: Record<string, unknown>;
}

export interface ClusterMoveRequest {
  group: number;
  node: string;
}

export interface ClusterMove {
  group: number;
  node: string;
  topology_epoch: number;
}

export interface ClusterRebalance {
  rebalance: string;
}

export interface ClusterDrainRequest {
  node: string;
  cancel?: boolean;
}

export interface ClusterDrain {
  node: string;
  draining: boolean;
}

/** This document. */
export type OpenAPIDocument = Record<string, unknown>;
