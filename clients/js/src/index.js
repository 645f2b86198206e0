// rankd's JavaScript client, for browsers and Node >= 18: the REST API, signed
// submissions, and the live feed (WebSocket, or Server-Sent Events where a
// WebSocket cannot be had).  No dependencies: fetch, WebSocket, EventSource
// and WebCrypto are the platform's.  Types: index.d.ts (api.d.ts is generated
// from the server's OpenAPI document).

const DEFAULT_TIMEOUT_MS = 10_000;

// --- errors ---------------------------------------------------------------------------

/** An error rankd answered (or a request that never got an answer). */
export class RankdError extends Error {
  constructor(code, message, { status = 0, body = null, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    /** rankd's error code (`not_found`, `invalid`, ...), or `connection`. */
    this.code = code;
    /** The HTTP status (0 when no answer came). */
    this.status = status;
    /** The error's JSON body, as rankd sent it. */
    this.body = body;
  }
}
/** The request was refused as it is: fix it before sending it again. */
export class InvalidInput extends RankdError {}
export class NotFound extends RankdError {}
/** `conflict`, or `event_conflict`: an event id reused for another submission. */
export class Conflict extends RankdError {}
export class Unauthorized extends RankdError {}
export class Forbidden extends RankdError {}
export class RateLimited extends RankdError {
  constructor(code, message, options = {}) {
    super(code, message, options);
    /** Seconds the server asked to wait (`Retry-After`), if it said. */
    this.retryAfter = options.retryAfter ?? null;
  }
}
/** The server cannot take the request now (read-only, storage, cluster); try again. */
export class Unavailable extends RankdError {}
/** The write may or may not have been applied: resubmit it with the same event id. */
export class Unacknowledged extends Unavailable {}
/** No answer: the server could not be reached, or did not answer in time. */
export class ConnectionFailed extends RankdError {}

const ERRORS = {
  bad_request: InvalidInput, invalid: InvalidInput, guard: InvalidInput,
  too_large: InvalidInput, unsupported_media_type: InvalidInput,
  method_not_allowed: InvalidInput, not_found: NotFound, conflict: Conflict,
  event_conflict: Conflict, unauthorized: Unauthorized, forbidden: Forbidden,
  rate_limited: RateLimited, too_many_connections: RateLimited, read_only: Unavailable,
  storage: Unavailable, unavailable: Unavailable, not_primary: Unavailable,
  misdirected: Unavailable, unacknowledged: Unacknowledged,
};

function errorOf(status, body, headers) {
  const error = body && typeof body === "object" && body.error;
  const code = error && typeof error.code === "string" ? error.code : `http_${status}`;
  const message = error && typeof error.message === "string" ? error.message
    : `rankd answered HTTP ${status}`;
  const Kind = ERRORS[code] ?? (status >= 500 ? Unavailable : RankdError);
  const retry = Number(headers?.get?.("Retry-After"));
  return new Kind(code, message, { status, body, retryAfter: Number.isFinite(retry) ? retry : null });
}

// --- signed submissions ---------------------------------------------------------------

const SIGNING_TAG = "rankd-signed-submission/v2\0";
const ABSENT = 0xffffffff;

/** A positive finite float64's exact decimal digits, and where the point goes:
 *  value = 0.DIGITS x 10^point. */
function exactDecimal(value) {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, value);
  const bits = view.getBigUint64(0);
  const biased = Number((bits >> 52n) & 0x7ffn);
  let mantissa = bits & ((1n << 52n) - 1n);
  let exponent = -1074; // subnormal
  if (biased !== 0) {
    mantissa |= 1n << 52n;
    exponent = biased - 1075;
  }
  if (exponent >= 0) {
    const digits = (mantissa << BigInt(exponent)).toString();
    return { digits, point: digits.length };
  }
  // m / 2^k = m * 5^k / 10^k: exact, in integers.
  const digits = (mantissa * 5n ** BigInt(-exponent)).toString();
  return { digits, point: digits.length + exponent };
}

/**
 * A float64 as C's printf("%.17g") writes it (the signed fields' numbers):
 * 17 significant digits rounded half to even from the exact value, plain or
 * exponent notation as %g picks, trailing zeros dropped.
 */
export function formatDouble(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw new RangeError(`a signed number must be finite, not ${value}`);
  }
  if (value === 0) return Object.is(value, -0) ? "-0" : "0";
  const sign = value < 0 ? "-" : "";
  let { digits, point } = exactDecimal(Math.abs(value));
  if (digits.length > 17) {
    const rest = digits.slice(17);
    const odd = Number(digits[16]) % 2 === 1;
    const up = rest[0] > "5" || (rest[0] === "5" && (odd || /[1-9]/.test(rest.slice(1))));
    digits = (BigInt(digits.slice(0, 17)) + (up ? 1n : 0n)).toString();
    if (digits.length > 17) { // 99...9 rounded up to 100...0
      digits = digits.slice(0, 17);
      point += 1;
    }
  }
  digits = digits.replace(/0+$/, "");
  const exponent = point - 1;
  if (exponent < -4 || exponent >= 17) {
    const mantissa = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    const power = String(Math.abs(exponent)).padStart(2, "0");
    return `${sign}${mantissa}e${exponent < 0 ? "-" : "+"}${power}`;
  }
  if (exponent >= 0) {
    const whole = digits.slice(0, point).padEnd(point, "0");
    const fraction = digits.slice(point);
    return sign + whole + (fraction ? `.${fraction}` : "");
  }
  return `${sign}0.${"0".repeat(-point)}${digits}`;
}

/**
 * The bytes a submission's signature covers (docs/security.md): the tag, then
 * board, member, kind, value, event_id, ts and label, each as a big-endian u32
 * length and UTF-8 bytes (an absent label: length 0xFFFFFFFF, no bytes).
 */
export function canonicalBytes(board, event) {
  const kind = event.score !== undefined && event.score !== null ? "score" : "delta";
  for (const field of ["member", kind, "event_id", "ts"]) {
    if (event[field] === undefined || event[field] === null) {
      throw new TypeError(`a signed submission needs ${field}`);
    }
  }
  const encoder = new TextEncoder();
  const fields = [board, event.member, kind, formatDouble(event[kind]), event.event_id,
                  formatDouble(event.ts), event.label ?? null];
  const parts = [encoder.encode(SIGNING_TAG)];
  for (const field of fields) {
    const length = new Uint8Array(4);
    if (field === null) {
      new DataView(length.buffer).setUint32(0, ABSENT);
      parts.push(length);
      continue;
    }
    const data = encoder.encode(String(field));
    new DataView(length.buffer).setUint32(0, data.length);
    parts.push(length, data);
  }
  const out = new Uint8Array(parts.reduce((total, part) => total + part.length, 0));
  let offset = 0;
  for (const part of parts) {
    out.set(part, offset);
    offset += part.length;
  }
  return out;
}

async function subtleCrypto() {
  if (globalThis.crypto?.subtle) return globalThis.crypto.subtle;
  const { webcrypto } = await import("node:crypto"); // Node 18 without the global
  return webcrypto.subtle;
}

/**
 * The `signature` of a submission to a `signed` board: `v2=` and the hex
 * HMAC-SHA256 of {@link canonicalBytes} with the server's signing secret.
 * Sign on a game server: a secret shipped to browsers is no secret.
 */
export async function sign(secret, board, event) {
  const subtle = await subtleCrypto();
  const key = await subtle.importKey("raw", new TextEncoder().encode(secret),
                                     { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const mac = new Uint8Array(await subtle.sign("HMAC", key, canonicalBytes(board, event)));
  return "v2=" + Array.from(mac, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

// --- REST -----------------------------------------------------------------------------

/** Query options in JavaScript's spelling, as the API spells them. */
const QUERY_NAMES = { minSeq: "min_seq" };

function queryString(options) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(options ?? {})) {
    if (value === undefined || value === null) continue;
    params.set(QUERY_NAMES[name] ?? name, Array.isArray(value) ? value.join(",") : String(value));
  }
  const text = params.toString();
  return text ? `?${text}` : "";
}

const segment = (text) => encodeURIComponent(String(text));

/** A rankd server.  Every method returns a promise of the answer's JSON. */
export class Rankd {
  /**
   * @param {object} [options]
   * @param {string} [options.url] the server's base URL (default: the page's origin)
   * @param {string} [options.token] an API key or JWT (sent as a bearer token)
   * @param {boolean} [options.readYourWrites] on a cluster, each read of a board
   *   waits until the node applied this client's last write to it (default true)
   */
  constructor({ url, token, timeoutMs = DEFAULT_TIMEOUT_MS, fetch: fetchImpl, WebSocket: socket,
                EventSource: eventSource, readYourWrites = true } = {}) {
    const base = url ?? globalThis.location?.origin;
    if (!base) throw new TypeError("new Rankd({url}): the server's URL is needed outside a page");
    this.url = String(base).replace(/\/+$/, "");
    this.token = token ?? null;
    this.timeoutMs = timeoutMs;
    this.fetch = fetchImpl ?? globalThis.fetch?.bind(globalThis);
    if (!this.fetch) throw new TypeError("no fetch: pass one as options.fetch");
    this.WebSocket = socket === undefined ? globalThis.WebSocket ?? null : socket;
    this.EventSource = eventSource === undefined ? globalThis.EventSource ?? null : eventSource;
    /** Session consistency: reads carry the position of this client's last write. */
    this.readYourWrites = readYourWrites;
    /** Board name -> `{epoch, seq}` of this client's last write to it. */
    this.positions = new Map();
  }

  /** Keep the log position a write's `answer` gives (a cluster's) as `board`'s. */
  remember(board, answer) {
    const { seq, epoch } = answer ?? {};
    if (!this.readYourWrites || !Number.isInteger(seq) || !Number.isInteger(epoch)) return answer;
    const known = this.positions.get(board);
    if (!known || seq > known.seq) this.positions.set(board, { epoch, seq });
    return answer;
  }

  /** Read `options` with the session's `minSeq` for `board` (unless one is given). */
  consistent(board, options = {}) {
    const known = this.readYourWrites ? this.positions.get(board) : undefined;
    return known && options.minSeq == null ? { ...options, minSeq: known.seq } : options;
  }

  /** One request; the answer's JSON, or a {@link RankdError}. */
  async request(method, path, { query, body, signal } = {}) {
    const headers = { Accept: "application/json" };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const timeout = new AbortController();
    const timer = setTimeout(() => timeout.abort(), this.timeoutMs);
    const abort = () => timeout.abort();
    signal?.addEventListener("abort", abort, { once: true });
    let response;
    try {
      response = await this.fetch(this.url + path + queryString(query), {
        method, headers, body: body === undefined ? undefined : JSON.stringify(body),
        signal: timeout.signal,
      });
    } catch (cause) {
      const why = timeout.signal.aborted && !signal?.aborted
        ? `no answer within ${this.timeoutMs} ms` : String(cause?.message ?? cause);
      throw new ConnectionFailed("connection", `${method} ${path}: ${why}`, { cause });
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", abort);
    }
    const text = await response.text();
    let payload = null;
    if (text) {
      try { payload = JSON.parse(text); } catch { payload = null; }
    }
    if (!response.ok) throw errorOf(response.status, payload, response.headers);
    return payload ?? {};
  }

  health() { return this.request("GET", "/v1/health"); }
  ready() { return this.request("GET", "/v1/ready"); }
  /** A page of boards: `{boards, next}`; pass `next` as `after` for the next page. */
  boards({ limit, after } = {}) { return this.request("GET", "/v1/boards", { query: { limit, after } }); }
  /** The board named `name` (nothing is sent until one of its methods is called). */
  board(name) { return new Board(this, name); }
  /** A short-lived token for the live feed (a server with credentials). */
  realtimeToken() { return this.request("GET", "/v1/realtime/token"); }
  /** The caller's own standing on a board (a JWT's subject). */
  me(board, options = {}) { return this.request("GET", `/v1/me/${segment(board)}`, { query: options }); }
  cluster() { return this.request("GET", "/v1/cluster"); }
  openapi() { return this.request("GET", "/v1/openapi.json"); }
}

/** One board's operations. */
export class Board {
  constructor(client, name) {
    this.client = client;
    this.name = name;
    this.path = `/v1/boards/${segment(name)}`;
  }

  get({ minSeq } = {}) {
    return this.client.request("GET", this.path, { query: this.reading({ minSeq }) });
  }
  /** Create the board, or replace its configuration. */
  put(config = {}, { discard } = {}) {
    return this.client.request("PUT", this.path, { body: config, query: { discard } });
  }
  patch(config, { discard } = {}) {
    return this.client.request("PATCH", this.path, { body: config, query: { discard } });
  }
  delete() { return this.client.request("DELETE", this.path); }

  /** Submit one score (`score` or `delta`; `event_id` makes a retry safe). */
  async submit(event) {
    const answer = await this.client.request("POST", `${this.path}/scores`, { body: event });
    return this.client.remember(this.name, answer);
  }
  /** Submit many events in one request: `{results}`, one result or error each. */
  async submitBatch(events) {
    const answer = await this.client.request("POST", `${this.path}/scores/batch`,
                                             { body: { events } });
    for (const result of answer.results ?? []) this.client.remember(this.name, result);
    return answer;
  }
  /** Sign `event` with `secret` and submit it (a `signed` board; see {@link sign}). */
  async submitSigned(secret, event) {
    const signed = { ts: Date.now() / 1000, ...event };
    signed.signature = await sign(secret, this.name, signed);
    return this.submit(signed);
  }

  /** `{entries, total, window, period, version}`; `limit`, `offset` page through it. */
  top(options = {}) {
    return this.client.request("GET", `${this.path}/top`, { query: this.reading(options) });
  }
  member(member, options = {}) {
    return this.client.request("GET", `${this.path}/members/${segment(member)}`,
                               { query: this.reading(options) });
  }
  around(member, options = {}) {
    return this.client.request("GET", `${this.path}/members/${segment(member)}/around`,
                               { query: this.reading(options) });
  }
  /** The standings of many members (a friends list): `{entries, missing}`. */
  ranks(members, options = {}) {
    return this.client.request("POST", `${this.path}/ranks`,
                               { body: { members }, query: this.reading(options) });
  }
  /** A read's options with the session's `minSeq` (see `readYourWrites`). */
  reading(options) { return this.client.consistent(this.name, options); }
  periods(options = {}) {
    return this.client.request("GET", `${this.path}/periods`, { query: options });
  }
  removeMember(member) {
    return this.client.request("DELETE", `${this.path}/members/${segment(member)}`);
  }

  /** Follow the board live: see {@link LiveFeed}. */
  live(options = {}) { return new LiveFeed(this, options); }
}

// --- the live feed --------------------------------------------------------------------

/** Messages an iteration that does not keep up may have waiting; older ones are dropped. */
const MAX_QUEUED = 1000;

/** Reconnection delays: 0.5 s doubling to 30 s, each with jitter. */
export const backoff = (attempt) => Math.min(30_000, 500 * 2 ** attempt) * (0.5 + Math.random() / 2);

/**
 * A live view of a board: the top `limit` of `window` and the standings of
 * followed members, pushed as they change.  Listen with `on("top" |
 * "member" | "state" | "resync" | "error", fn)`, or iterate it
 * (`for await (const message of feed)`) for every top and member message.
 *
 * It connects over WebSocket (Server-Sent Events if none can be had, or if
 * WebSocket connections keep failing before they open), fetches a join
 * token first on a server with credentials, reconnects with backoff and
 * resumes the same view, pings to tell a dead connection from a quiet
 * board, and never goes back in time: a message older (by `version`) than
 * what was shown is dropped.  After a reconnection it re-reads the top over
 * REST at once ("resync"), so what was missed while away shows even before
 * the feed is back.
 */
export class LiveFeed {
  constructor(board, { window, limit = 10, follow = [], transport = "auto",
                       heartbeatMs = 15_000, autoStart = true } = {}) {
    this.board = board;
    this.client = board.client;
    this.window = window ?? null;
    this.limit = limit;
    this.followed = new Set(follow);
    this.heartbeatMs = heartbeatMs;
    /** `websocket` or `sse`, the transport in use (or to be tried next). */
    this.transport = transport === "auto" ? (this.client.WebSocket ? "websocket" : "sse") : transport;
    this.fixedTransport = transport !== "auto";
    /** connecting, live, reconnecting or closed. */
    this.state = "connecting";
    /** The version of the last top shown (a message below it is stale). */
    this.version = 0;
    /** Stale messages dropped, reconnections made. */
    this.stats = { stale: 0, reconnects: 0 };
    this.listeners = new Map();
    /** Messages not read yet by an iteration (none kept when only listened to). */
    this.queue = [];
    this.iterating = false;
    this.waiting = [];
    this.attempt = 0;
    this.failedOpens = 0;
    this.connection = null;
    this.timers = new Set();
    this.closed = false;
    this.everOpened = false;
    if (autoStart) this.start();
  }

  on(type, listener) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(listener);
    return this;
  }

  off(type, listener) {
    this.listeners.get(type)?.delete(listener);
    return this;
  }

  /** Follow more members: their standings come as `member` messages. */
  follow(members) {
    const added = members.filter((member) => !this.followed.has(member));
    added.forEach((member) => this.followed.add(member));
    if (added.length) this.sendOrReconnect({ action: "follow", members: added });
  }

  unfollow(members) {
    const removed = members.filter((member) => this.followed.delete(member));
    if (removed.length) this.sendOrReconnect({ action: "unfollow", members: removed });
  }

  /** Stop for good; an iteration ends. */
  close() {
    if (this.closed) return;
    this.closed = true;
    this.timers.forEach((timer) => clearTimeout(timer));
    this.timers.clear();
    this.connection?.close();
    this.connection = null;
    this.setState("closed");
    for (const resolve of this.waiting.splice(0)) resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator]() {
    this.iterating = true;
    return {
      next: () => {
        if (this.queue.length) return Promise.resolve({ value: this.queue.shift(), done: false });
        if (this.closed) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => this.waiting.push(resolve));
      },
      return: () => {
        this.close();
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }

  start() {
    this.connect().catch((error) => this.emit("error", error));
  }

  // --- internals ---

  emit(type, value) {
    for (const listener of this.listeners.get(type) ?? []) {
      try { listener(value); } catch (error) { queueMicrotask(() => { throw error; }); }
    }
  }

  deliver(message) {
    if (message.type === "leaderboard.updated") {
      if (message.version < this.version) { this.stats.stale += 1; return; }
      this.version = message.version;
      this.emit("top", message);
    } else if (message.type === "user.rank.updated") {
      if (!this.followed.has(message.member)) return;
      this.emit("member", message);
    } else {
      if (message.type === "error") this.emit("error", errorOf(0, { error: message }));
      return;
    }
    const waiter = this.waiting.shift();
    if (waiter) {
      waiter({ value: message, done: false });
    } else if (this.iterating) { // only an iteration reads the queue
      this.queue.push(message);
      if (this.queue.length > MAX_QUEUED) this.queue.shift(); // a reader far behind
    }
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.emit("state", state);
  }

  later(fn, ms) {
    const timer = setTimeout(() => { this.timers.delete(timer); fn(); }, ms);
    this.timers.add(timer);
    return timer;
  }

  sendOrReconnect(message) {
    if (this.transport === "websocket") {
      // Not open yet: the socket sends what changed when it opens.
      if (this.connection?.open) this.connection.send(message);
    } else if (this.connection) {
      this.reconnectNow(); // Server-Sent Events: the view is in the URL
    }
  }

  /** On a socket just opened: follow what changed since its URL was made. */
  syncFollows(connection, subscribed) {
    const added = [...this.followed].filter((member) => !subscribed.has(member));
    const removed = [...subscribed].filter((member) => !this.followed.has(member));
    if (added.length) connection.send({ action: "follow", members: added });
    if (removed.length) connection.send({ action: "unfollow", members: removed });
  }

  reconnectNow() {
    this.connection?.close();
    this.connection = null;
    this.attempt = 0;
    this.connect().catch((error) => this.emit("error", error));
  }

  /** The subscription's query: the view, and a join token if the client has a credential. */
  async query(members) {
    const params = { window: this.window ?? undefined, limit: this.limit,
                     members: members.size ? [...members] : undefined };
    if (this.client.token) params.token = (await this.client.realtimeToken()).token;
    return queryString(params);
  }

  /**
   * Why a connection did not open: the server's refusal of the same
   * subscription over plain HTTP (/events answers errors before streaming),
   * a ConnectionFailed, or null when /events would open (so it is the
   * WebSocket that fails: a proxy).
   */
  async explain(url) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), this.client.timeoutMs);
    try {
      const response = await this.client.fetch(url, { headers: { Accept: "text/event-stream" },
                                                      signal: abort.signal });
      if (response.ok) return null;
      return errorOf(response.status, await response.json().catch(() => null), response.headers);
    } catch (cause) {
      return new ConnectionFailed("connection", `cannot reach ${this.client.url}: ` +
                                  `${cause?.message ?? cause}`, { cause });
    } finally {
      clearTimeout(timer);
      abort.abort();
    }
  }

  async connect() {
    if (this.closed) return;
    this.setState(this.everOpened ? "reconnecting" : "connecting");
    let query;
    const subscribed = new Set(this.followed);
    try {
      query = await this.query(subscribed);
    } catch (error) {
      this.emit("error", error);
      this.retry(isRefusal(error));
      return;
    }
    if (this.closed) return;
    const base = this.client.url + this.board.path;
    const events = `${base}/events${query}`;
    const handlers = {
      open: () => {
        this.attempt = 0;
        this.failedOpens = 0;
        if (this.everOpened) {
          this.stats.reconnects += 1;
          this.resync();
        }
        this.everOpened = true;
        this.setState("live");
        if (this.transport === "websocket") {
          this.syncFollows(this.connection, subscribed);
        } else if (subscribed.size !== this.followed.size
                   || [...subscribed].some((member) => !this.followed.has(member))) {
          this.reconnectNow(); // followed changed while it connected: the view is in the URL
        }
      },
      message: (message) => this.deliver(message),
      lost: (opened, error) => {
        if (this.closed) return;
        this.connection = null;
        if (opened) {
          this.retry(false);
          return;
        }
        (error ? Promise.resolve(error) : this.explain(events)).then((why) => {
          if (why === null) this.failedOpens += 1; // the server is fine: the socket is not
          else this.emit("error", why);
          this.retry(isRefusal(why));
        });
      },
    };
    if (this.transport === "websocket") {
      this.connection = openSocket(this.client.WebSocket, `${base.replace(/^http/, "ws")}/live${query}`,
                                   handlers, this.heartbeatMs);
    } else {
      this.connection = this.client.EventSource
        ? openEventSource(this.client.EventSource, events, handlers)
        : openEventStream(this.client.fetch, events, handlers, this.heartbeatMs);
    }
  }

  retry(refused) {
    if (this.closed) return;
    // WebSocket connections that never open (a proxy that drops upgrades):
    // Server-Sent Events are plain HTTP.
    if (this.transport === "websocket" && !this.fixedTransport && this.failedOpens >= 2) {
      this.transport = "sse";
      this.attempt = 0;
    }
    this.setState(this.everOpened ? "reconnecting" : "connecting");
    const delay = backoff(refused ? Math.max(this.attempt, 4) : this.attempt);
    this.attempt += 1;
    this.later(() => this.connect().catch((error) => this.emit("error", error)), delay);
  }

  /** After a reconnection: read the top over REST now (what was missed). */
  resync() {
    this.emit("resync", { version: this.version });
    this.board.top({ window: this.window ?? undefined, limit: this.limit }).then((page) => {
      if (!this.closed) {
        this.deliver({ type: "leaderboard.updated", board: this.board.name, window: page.window,
                       period: page.period, version: page.version, top: page.entries,
                       ts: page.updated_at, source: "rest" });
      }
    }, (error) => this.emit("error", error));
  }
}

/** A refusal that waiting will not change soon (credentials, a board gone): back off long. */
function isRefusal(error) {
  return error instanceof RankdError && error.status >= 400 && error.status < 500
    && !(error instanceof RateLimited);
}

function parse(text) {
  try { return JSON.parse(text); } catch { return null; }
}

function openSocket(WebSocketImpl, url, handlers, heartbeatMs) {
  const socket = new WebSocketImpl(url);
  let opened = false;
  let heard = Date.now();
  let pinger = null;
  const connection = {
    open: false,
    send(message) { if (socket.readyState === 1) socket.send(JSON.stringify(message)); },
    close() {
      clearInterval(pinger);
      socket.onclose = socket.onerror = socket.onmessage = null;
      try { socket.close(); } catch { /* already closed */ }
    },
  };
  socket.onopen = () => {
    opened = connection.open = true;
    heard = Date.now();
    // A quiet board sends nothing: a pong tells a live connection from a dead one.
    pinger = setInterval(() => {
      if (Date.now() - heard > heartbeatMs * 2) {
        connection.close();
        handlers.lost(true);
        return;
      }
      connection.send({ action: "ping" });
    }, heartbeatMs);
    handlers.open();
  };
  socket.onmessage = (event) => {
    heard = Date.now();
    const message = parse(event.data);
    if (message && message.type !== "pong") handlers.message(message);
  };
  // Once, whichever comes: a refused handshake fires only "error" in some
  // implementations (Node's), "error" then "close" in browsers.
  socket.onclose = socket.onerror = () => {
    clearInterval(pinger);
    connection.open = false;
    socket.onclose = socket.onerror = null;
    handlers.lost(opened);
  };
  return connection;
}

const SSE_EVENTS = ["leaderboard.updated", "user.rank.updated"];

function openEventSource(EventSourceImpl, url, handlers) {
  const source = new EventSourceImpl(url);
  let opened = false;
  const onEvent = (event) => { const message = parse(event.data); if (message) handlers.message(message); };
  SSE_EVENTS.forEach((name) => source.addEventListener(name, onEvent));
  source.onopen = () => { opened = true; handlers.open(); };
  // EventSource would reconnect by itself, with the join token it was given
  // (short-lived): reconnect here instead, with a new one.
  const lost = () => { connection.close(); handlers.lost(opened); };
  source.addEventListener("closed", lost);
  source.onerror = lost;
  const connection = { open: false, close() { source.onerror = null; source.close(); } };
  return connection;
}

/** Server-Sent Events over fetch, where there is no EventSource (Node). */
function openEventStream(fetchImpl, url, handlers, heartbeatMs) {
  const abort = new AbortController();
  let deliberate = false;
  const connection = { open: false, close() { deliberate = true; abort.abort(); } };
  let heard = Date.now();
  // The server sends a comment every 15 s: silence much longer is a dead link.
  const watchdog = setInterval(() => {
    if (Date.now() - heard > Math.max(heartbeatMs, 15_000) * 2.5) abort.abort();
  }, heartbeatMs);
  (async () => {
    let opened = false;
    let refusal;
    try {
      let response;
      try {
        response = await fetchImpl(url, { headers: { Accept: "text/event-stream" },
                                          signal: abort.signal });
      } catch (cause) {
        refusal = new ConnectionFailed("connection", `cannot reach the live feed: ${cause?.message ?? cause}`,
                                       { cause });
        throw cause;
      }
      if (!response.ok || !response.body) {
        refusal = errorOf(response.status, await response.json().catch(() => null),
                          response.headers);
        throw refusal;
      }
      opened = connection.open = true;
      handlers.open();
      const decoder = new TextDecoder();
      let buffer = "";
      for await (const chunk of response.body) {
        heard = Date.now();
        buffer += decoder.decode(chunk, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let event = "message";
          const data = [];
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          }
          if (event === "closed") throw new Error("closed by the server");
          if (SSE_EVENTS.includes(event)) {
            const message = parse(data.join("\n"));
            if (message) handlers.message(message);
          }
        }
      }
    } catch {
      // lost: below
    } finally {
      clearInterval(watchdog);
      connection.open = false;
    }
    if (!deliberate) handlers.lost(opened, refusal);
  })();
  return connection;
}
