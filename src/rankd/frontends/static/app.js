// rankd's live page, on rankd's JavaScript client (/static/rankd.js is
// clients/js/src/index.js): one implementation of the live protocol.
// Every view state lives in the URL, so a view can be shared and reloaded; a
// credential never does (URLs end up in history, logs and shared links).
import { Forbidden, NotFound, Rankd, Unauthorized } from "/static/rankd.js";

const $ = (id) => document.getElementById(id);
const WINDOWS = [["all", "All time"], ["daily", "Today"], ["weekly", "This week"],
                 ["monthly", "This month"]];
const SCOPES = ["top", "around", "friends"];
const LIMITS = [10, 25, 50, 100];
/** Views the live feed does not cover whole are also re-read this often. */
const REFRESH_MS = 5000;

const numbers = new Intl.NumberFormat(undefined, { maximumFractionDigits: 2 });
const format = (value) => (value === null || value === undefined ? "–" : numbers.format(value));

// --- the view, in the URL ----------------------------------------------------------------

const query = new URLSearchParams(location.search);
// A credential in the address (an old link) is taken once, kept in memory
// only, and removed from the address bar and its history entry at once.
let credential = query.get("token");
if (credential !== null) {
  query.delete("token");
  const rest = query.toString();
  history.replaceState(null, "", `${location.pathname}${rest ? `?${rest}` : ""}`);
}
const listed = (text) => (text || "").split(",").map((name) => name.trim()).filter(Boolean);
const view = {
  board: query.get("board"),
  window: query.get("window"),
  period: query.get("period") || "",
  scope: SCOPES.includes(query.get("scope")) ? query.get("scope") : "top",
  me: query.get("me") || query.get("follow") || "", // `follow` is the first page's name
  friends: listed(query.get("friends")).slice(0, 100),
  limit: LIMITS.includes(Number(query.get("limit"))) ? Number(query.get("limit")) : 10,
  page: Math.max(1, Number.parseInt(query.get("page"), 10) || 1),
};

function keepInURL() {
  const params = new URLSearchParams();
  if (view.board) params.set("board", view.board);
  if (view.window) params.set("window", view.window);
  if (view.period) params.set("period", view.period);
  if (view.scope !== "top") params.set("scope", view.scope);
  if (view.me) params.set("me", view.me);
  if (view.friends.length) params.set("friends", view.friends.join(","));
  if (view.limit !== 10) params.set("limit", String(view.limit));
  if (view.page > 1) params.set("page", String(view.page));
  history.replaceState(null, "", `?${params}`);
}

// --- what the page knows -------------------------------------------------------------------

const rankd = new Rankd({ url: location.origin, token: credential || undefined });
const state = {
  boards: [],
  feed: null,
  feedState: "connecting",
  refreshTimer: null,
  pending: null,
  totalPending: null,
  /** Each member's rank when first seen in this view: movement is since then. */
  baseline: new Map(),
  /** Ranks at the last render: a row whose rank changed flashes. */
  lastRanks: new Map(),
  /** Labels seen, for finding a member by the name the page shows. */
  labels: new Map(),
  total: 0,
  leader: null,
  meRank: undefined,
  highlight: null,
};

function notice(text) {
  $("notice").hidden = !text;
  $("notice").textContent = text || "";
}

function badge(kind, text) {
  const element = $("state");
  element.className = `state ${kind}`;
  element.textContent = text;
}

function announce(text) {
  $("announcer").textContent = text;
}

const board = () => rankd.board(view.board);
const readOptions = () => ({ window: view.window, period: view.period || undefined });
const memberOf = (name) => state.labels.get(name) || name;
const isLive = () => !view.period;

// --- rendering -----------------------------------------------------------------------------

function movement(entry) {
  const before = state.baseline.get(entry.member);
  if (before === undefined) {
    const fresh = state.baseline.size > 0;
    state.baseline.set(entry.member, entry.rank);
    return fresh ? ["new", "up", "new since the page opened"] : ["", "", ""];
  }
  if (before > entry.rank) return [`▲${before - entry.rank}`, "up", `up ${before - entry.rank}`];
  if (before < entry.rank) return [`▼${entry.rank - before}`, "down", `down ${entry.rank - before}`];
  return ["", "", ""];
}

function row(entry) {
  const tr = document.createElement("tr");
  const [move, direction, spoken] = movement(entry);
  if (direction) tr.classList.add(direction);
  const last = state.lastRanks.get(entry.member);
  if (last !== undefined && last !== entry.rank) tr.classList.add("changed");
  if (entry.member === view.me) tr.classList.add("me");
  if (entry.member === state.highlight) tr.classList.add("found");
  if (entry.label) state.labels.set(entry.label, entry.member);
  const name = entry.label || entry.member;
  const cells = [["rank", format(entry.rank)], ["member", name], ["score", format(entry.score)],
                 ["move", move]];
  for (const [kind, text] of cells) {
    const td = document.createElement("td");
    td.className = kind;
    td.textContent = text;
    if (kind === "member") td.title = entry.label ? `${entry.label} (${entry.member})` : entry.member;
    if (kind === "move" && spoken) td.setAttribute("aria-label", spoken);
    tr.appendChild(td);
  }
  tr.dataset.member = entry.member;
  return tr;
}

function renderRows(entries, { total = null, emptyText = "No scores yet in this period." } = {}) {
  $("top").tBodies[0].replaceChildren(...entries.map(row));
  state.lastRanks = new Map(entries.map((entry) => [entry.member, entry.rank]));
  $("empty").hidden = entries.length > 0;
  $("empty").textContent = emptyText;
  if (total !== null) state.total = total;
  renderPager();
}

function renderPager() {
  const paged = view.scope === "top";
  $("pager").hidden = !paged;
  if (!paged) return;
  const pages = Math.max(1, Math.ceil(state.total / view.limit));
  $("previous").disabled = view.page <= 1;
  $("next").disabled = view.page >= pages;
  $("page-info").textContent = `Page ${format(view.page)} of ${format(pages)}`;
}

function renderTitle() {
  const windowName = (WINDOWS.find(([id]) => id === view.window) || [null, view.window])[1];
  const period = view.period ? ` · ${view.period}` : "";
  const what = { top: "Top", around: `Around ${view.me || "me"}`, friends: "Friends" }[view.scope];
  $("view-title").textContent = `${what} · ${windowName}${period}`;
  for (const button of $("scopes").querySelectorAll("button")) {
    button.setAttribute("aria-pressed", String(button.dataset.scope === view.scope));
  }
  for (const button of $("windows").querySelectorAll("button")) {
    button.setAttribute("aria-pressed", String(button.dataset.window === view.window));
  }
  $("friends-form").hidden = view.scope !== "friends";
  $("friends").value = view.friends.join(", ");
  $("me-name").value = view.me;
}

function renderMe(standing) {
  const card = $("me-card");
  if (!view.me) { card.hidden = true; return; }
  card.hidden = false;
  if (!standing || standing.rank === null || standing.rank === undefined) {
    card.textContent = `${view.me} has no score in this period.`;
    state.meRank = null;
    return;
  }
  const of = standing.total ? ` of ${format(standing.total)}` : "";
  card.textContent = `${view.me}: rank ${format(standing.rank)}${of} with ${format(standing.score)}`;
  const before = state.meRank;
  if (before && before !== standing.rank) {
    const change = before > standing.rank ? `up ${before - standing.rank}` : `down ${standing.rank - before}`;
    announce(`${view.me} is now rank ${format(standing.rank)}, ${change}.`);
  }
  state.meRank = standing.rank;
}

function noteLeader(entries) {
  if (view.scope !== "top" || view.page !== 1 || !entries.length) return;
  const leader = entries[0].member;
  if (state.leader && state.leader !== leader) announce(`${entries[0].label || leader} takes the lead.`);
  state.leader = leader;
}

// --- reading -------------------------------------------------------------------------------

/** Whether the live feed's own top is the view (then no re-reading is needed). */
const feedIsTheView = () => isLive() && view.scope === "top" && view.page === 1;

async function refresh() {
  if (!view.board) return;
  try {
    if (view.scope === "top") {
      const page = await board().top({ ...readOptions(), limit: view.limit,
                                       offset: (view.page - 1) * view.limit });
      noteLeader(page.entries);
      renderRows(page.entries, { total: page.total });
    } else if (view.scope === "around") {
      if (!view.me) {
        renderRows([], { emptyText: "Say who you are (Me) to see the members around you." });
      } else {
        try {
          const page = await board().around(view.me, { ...readOptions(), above: 5, below: 5 });
          renderRows(page.entries);
        } catch (error) {
          if (!(error instanceof NotFound)) throw error;
          renderRows([], { emptyText: `${view.me} has no score in this period.` });
        }
      }
    } else {
      const result = view.friends.length
        ? await board().ranks(view.friends, readOptions()) : { entries: [], missing: [] };
      const missing = result.missing.length ? ` Not ranked: ${result.missing.join(", ")}.` : "";
      renderRows(result.entries, {
        emptyText: view.friends.length ? `None of them has a score in this period.${missing}`
          : "List your friends' member names to compare with them." });
      $("found").hidden = !missing;
      $("found").textContent = missing.trim();
    }
    if (view.me) {
      try { renderMe(await board().member(view.me, readOptions())); }
      catch (error) { if (error instanceof NotFound) renderMe(null); else throw error; }
    } else {
      renderMe(null);
    }
    if (!isLive()) badge("closed", "closed period");
    else if (state.feedState !== "live") badge("polling", "polling");
  } catch (error) {
    badge("offline", "offline");
  }
}

/** Re-read soon (changes come in bursts: one read for a burst). */
function refreshSoon() {
  if (state.pending) return;
  state.pending = setTimeout(() => { state.pending = null; refresh(); }, 200);
}

function stopFeed() {
  state.feed?.close();
  state.feed = null;
  clearInterval(state.refreshTimer);
  state.refreshTimer = null;
}

function startFeed() {
  stopFeed();
  keepInURL();
  renderTitle();
  refresh();
  if (!isLive()) return; // a closed period does not change
  const follow = [...new Set([view.me, ...(view.scope === "friends" ? view.friends : [])])]
    .filter(Boolean).slice(0, 100);
  const feed = board().live({ window: view.window, limit: feedIsTheView() ? view.limit : 100,
                              follow });
  state.feed = feed;
  feed.on("state", (feedState) => {
    state.feedState = feedState;
    if (feedState === "live") badge("live", "live");
    else if (feedState !== "closed") badge(feedState, `${feedState}…`);
  });
  feed.on("top", (message) => {
    if (feedIsTheView()) {
      noteLeader(message.top);
      state.total = Math.max(state.total, message.top.length);
      renderRows(message.top);
      totalSoon();
    } else {
      refreshSoon();
    }
  });
  feed.on("member", (message) => {
    if (message.member === view.me) renderMe(message);
    if (!feedIsTheView()) refreshSoon();
  });
  // What the feed does not push (pages beyond its rows, neighbours, friends),
  // and everything while it is away, is re-read now and then.
  state.refreshTimer = setInterval(() => {
    if (!feedIsTheView() || state.feedState !== "live") refresh();
  }, REFRESH_MS);
}

/** The member count, for the pager (the live top does not carry it), at most once a second. */
function totalSoon() {
  if (state.totalPending) return;
  state.totalPending = setTimeout(() => { state.totalPending = null; refreshTotal(); }, 1000);
}

async function refreshTotal() {
  try {
    const info = await board().get();
    state.total = info.members[view.window] ?? state.total;
    renderPager();
  } catch { /* the next update tries again */ }
}

// --- choosing a view -------------------------------------------------------------------------

async function loadBoards() {
  let boards = [];
  try {
    let page = await rankd.boards({ limit: 100 });
    boards = page.boards;
    while (page.next && boards.length < 1000) {
      page = await rankd.boards({ limit: 100, after: page.next });
      boards = boards.concat(page.boards);
    }
  } catch (error) {
    if (error instanceof Unauthorized || error instanceof Forbidden) {
      badge("offline", "needs a token");
      notice(credential ? "This token cannot read this server's boards."
        : "This server needs a read token to show its boards.");
      $("token-form").hidden = false;
      return;
    }
    badge("offline", "offline");
    setTimeout(loadBoards, 2000);
    return;
  }
  state.boards = boards;
  const select = $("board");
  select.replaceChildren(...boards.map((b) => new Option(b.name, b.name)));
  if (!boards.length) {
    badge("offline", "no boards yet");
    setTimeout(loadBoards, 2000);
    return;
  }
  if (view.board && !boards.some((b) => b.name === view.board)) {
    badge("offline", "no such board");
    notice(`There is no board named “${view.board}”: pick one.`);
    select.value = "";
    return;
  }
  pickBoard(view.board || boards[0].name, false);
}

function pickBoard(name, fresh) {
  const info = state.boards.find((b) => b.name === name);
  notice("");
  view.board = name;
  $("board").value = name;
  const windows = WINDOWS.filter(([id]) => info.config.windows.includes(id));
  $("windows").replaceChildren(...windows.map(([id, text]) => {
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.window = id;
    button.textContent = text;
    return button;
  }));
  const primary = info.config.windows.includes("all") ? "all" : info.config.windows[0];
  if (fresh) Object.assign(view, { period: "", page: 1 });
  if (fresh || !info.config.windows.includes(view.window)) view.window = primary;
  $("limit").value = String(view.limit);
  changeView();
}

/** A new board, window or period: movement counts from now. */
async function changeView() {
  state.baseline = new Map();
  state.lastRanks = new Map();
  state.leader = null;
  state.meRank = undefined;
  await loadPeriods();
  startFeed();
}

async function loadPeriods() {
  const select = $("period");
  const options = [new Option("Current", "")];
  try {
    const periods = await board().periods({ window: view.window });
    if (view.window !== "all") options[0].text = `Current (${periods.current})`;
    for (const id of [...periods.retained].reverse()) options.push(new Option(id, id));
  } catch { /* only the current period then */ }
  select.replaceChildren(...options);
  if (![...select.options].some((option) => option.value === view.period)) view.period = "";
  select.value = view.period;
  select.disabled = options.length === 1;
}

/** Labels are not indexed: the first rows of the board, searched here. */
const SEARCHED_ROWS = 1000;

/** The member `text` names: a member name, or a label (whole, then in part). */
async function lookUp(text) {
  if (state.labels.has(text)) return state.labels.get(text);
  try {
    return (await board().member(text, readOptions())).member;
  } catch (error) {
    if (!(error instanceof NotFound)) throw error;
  }
  const wanted = text.toLocaleLowerCase();
  let partly = null;
  for (let offset = 0; offset < SEARCHED_ROWS; offset += 100) {
    const page = await board().top({ ...readOptions(), limit: 100, offset });
    for (const entry of page.entries) {
      const label = (entry.label || "").toLocaleLowerCase();
      if (label === wanted) return entry.member;
      if (!partly && label.includes(wanted)) partly = entry.member;
    }
    if (page.entries.length < 100) break;
  }
  return partly ?? text;
}

async function find(text) {
  const found = $("found");
  found.hidden = false;
  try {
    const member = await lookUp(text);
    const standing = await board().member(member, readOptions());
    state.highlight = standing.member;
    found.textContent = `${standing.label || standing.member}: rank ${format(standing.rank)} of ` +
      `${format(standing.total)} with ${format(standing.score)}.`;
    Object.assign(view, { scope: "top", page: Math.ceil(standing.rank / view.limit) });
    startFeed();
  } catch (error) {
    state.highlight = null;
    found.textContent = error instanceof NotFound ? `No member “${text}” in this period.`
      : "The search failed; try again.";
  }
}

$("board").addEventListener("change", (event) => pickBoard(event.target.value, true));
$("windows").addEventListener("click", (event) => {
  const button = event.target.closest("button");
  if (!button || button.dataset.window === view.window) return;
  Object.assign(view, { window: button.dataset.window, period: "", page: 1 });
  changeView();
});
$("period").addEventListener("change", (event) => {
  Object.assign(view, { period: event.target.value, page: 1 });
  changeView();
});
$("limit").addEventListener("change", (event) => {
  Object.assign(view, { limit: Number(event.target.value), page: 1 });
  startFeed();
});
$("scopes").addEventListener("click", (event) => {
  const button = event.target.closest("button");
  if (!button) return;
  Object.assign(view, { scope: button.dataset.scope, page: 1 });
  state.highlight = null;
  startFeed();
});
$("previous").addEventListener("click", () => { view.page = Math.max(1, view.page - 1); startFeed(); });
$("next").addEventListener("click", () => { view.page += 1; startFeed(); });
$("me-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const name = $("me-name").value.trim();
  Object.assign(view, { me: name ? memberOf(name) : "", scope: name ? "around" : view.scope,
                        page: 1 });
  state.meRank = undefined;
  startFeed();
});
$("search-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("search").value.trim();
  if (text) find(text);
});
$("friends-form").addEventListener("submit", (event) => {
  event.preventDefault();
  view.friends = listed($("friends").value).map(memberOf).slice(0, 100);
  startFeed();
});
$("top").tBodies[0].addEventListener("click", (event) => {
  const tr = event.target.closest("tr");
  if (!tr?.dataset.member) return;
  Object.assign(view, { me: tr.dataset.member });
  state.meRank = undefined;
  startFeed();
});
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  // Kept in memory (the client sends it as a bearer token, and mints join
  // tokens with it for the live feed); a reload asks again.
  credential = $("token").value.trim() || null;
  $("token").value = "";
  rankd.token = credential;
  $("token-form").hidden = true;
  notice("");
  badge("connecting", "connecting…");
  loadBoards();
});
loadBoards();
