// rankd live page: WebSocket first, polling REST as a fallback; no libraries.
"use strict";

const $ = (id) => document.getElementById(id);
// The view (board, window, rows, followed member) lives in the URL, so a
// view can be shared and survives a reload.
const query = new URLSearchParams(location.search);
const state = { board: null, window: query.get("window"), limit: Number(query.get("limit")) || 10,
                follow: query.get("follow"), socket: null, retry: 0, pollTimer: null,
                retryTimer: null, lastRanks: new Map(), labels: new Map(), version: 0 };

function keepInURL() {
  const params = new URLSearchParams();
  if (credential) params.set("token", credential);
  params.set("board", state.board);
  params.set("window", state.window);
  if (state.limit !== 10) params.set("limit", state.limit);
  if (state.follow) params.set("follow", state.follow);
  history.replaceState(null, "", "?" + params);
}

function notice(text) {
  $("notice").hidden = !text;
  $("notice").textContent = text || "";
}

function setState(kind, text) {
  const el = $("state");
  el.className = "state " + kind;
  el.textContent = text;
}

// On a server with credentials, open the page as /?token=<a read token>: REST
// calls send it as a bearer token and the live feed gets a short join token.
const credential = new URLSearchParams(location.search).get("token");

class HttpError extends Error {
  constructor(path, status) { super(path + ": " + status); this.status = status; }
}

async function getJSON(path) {
  const headers = { Accept: "application/json" };
  if (credential) headers.Authorization = "Bearer " + credential;
  const response = await fetch(path, { headers });
  if (!response.ok) throw new HttpError(path, response.status);
  return response.json();
}

function formatScore(score) {
  return Number.isInteger(score) ? String(score) : score.toFixed(2);
}

function renderTop(message) {
  if (message.version < state.version) return;  // never go back in time
  state.version = message.version;
  $("period").textContent = message.period === "all" ? "" : "· " + message.period;
  const body = $("top").tBodies[0];
  const rows = [];
  const ranks = new Map();
  state.labels = new Map();
  for (const entry of message.top) {
    if (entry.label) state.labels.set(entry.label, entry.member);
    const tr = document.createElement("tr");
    const before = state.lastRanks.get(entry.member);
    let move = "";
    if (before === undefined && state.lastRanks.size) { move = "new"; tr.className = "up changed"; }
    else if (before > entry.rank) { move = "▲" + (before - entry.rank); tr.className = "up changed"; }
    else if (before < entry.rank) { move = "▼" + (entry.rank - before); tr.className = "down changed"; }
    if (entry.member === state.follow) tr.classList.add("me");
    for (const [cls, text] of [["rank", entry.rank], ["member", entry.label || entry.member],
                               ["score", formatScore(entry.score)], ["move", move]]) {
      const td = document.createElement("td");
      td.className = cls;
      td.textContent = text;
      tr.appendChild(td);
    }
    tr.dataset.member = entry.member;
    rows.push(tr);
    ranks.set(entry.member, entry.rank);
  }
  body.replaceChildren(...rows);
  state.lastRanks = ranks;
  $("empty").hidden = message.top.length > 0;
}

async function renderFollowed(message) {
  if (message.member !== state.follow) return;
  $("followed").textContent = message.rank === null
    ? message.member + " has no score in this period."
    : message.member + ": rank " + message.rank + " with " + formatScore(message.score);
  if (message.rank === null) { $("around").tBodies[0].replaceChildren(); return; }
  try {
    const q = "?above=2&below=2&window=" + encodeURIComponent(state.window);
    const page = await getJSON("/v1/boards/" + encodeURIComponent(state.board) + "/members/" +
                               encodeURIComponent(message.member) + "/around" + q);
    const rows = page.entries.map((e) => {
      const tr = document.createElement("tr");
      if (e.member === state.follow) tr.className = "me";
      tr.innerHTML = "<td class=rank></td><td class=member></td><td class=score></td>";
      tr.children[0].textContent = e.rank;
      tr.children[1].textContent = e.label || e.member;
      tr.children[2].textContent = formatScore(e.score);
      return tr;
    });
    $("around").tBodies[0].replaceChildren(...rows);
  } catch (error) { /* the next update retries */ }
}

function onMessage(text) {
  const message = JSON.parse(text);
  if (message.type === "leaderboard.updated") renderTop(message);
  else if (message.type === "user.rank.updated") renderFollowed(message);
}

function stopFeed() {
  if (state.socket) { state.socket.onclose = null; state.socket.close(); state.socket = null; }
  if (state.pollTimer) { clearInterval(state.pollTimer); state.pollTimer = null; }
  if (state.retryTimer) { clearTimeout(state.retryTimer); state.retryTimer = null; }
}

// Backoff with jitter: 0.5 s, 1 s, 2 s... up to 30 s.
const backoff = (retry) => Math.min(30000, 500 * 2 ** retry) * (0.5 + Math.random() / 2);

async function startFeed(reconnecting = false) {
  stopFeed();
  keepInURL();
  state.version = 0;  // a restarted daemon may count from elsewhere
  if (!reconnecting) state.lastRanks = new Map();  // moves stay relative to before
  const params = new URLSearchParams({ window: state.window, limit: state.limit });
  if (state.follow) params.set("members", state.follow);
  if (credential) {
    try { params.set("token", (await getJSON("/v1/realtime/token")).token); }
    catch (error) { setState("offline", "not authorized"); return; }
  }
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  const url = scheme + location.host + "/v1/boards/" + encodeURIComponent(state.board) +
              "/live?" + params;
  setState("connecting", "connecting…");
  let opened = false;
  const socket = new WebSocket(url);
  state.socket = socket;
  socket.onopen = () => { opened = true; state.retry = 0; setState("live", "live"); };
  socket.onmessage = (event) => onMessage(event.data);
  socket.onclose = () => {
    state.socket = null;
    state.retry += 1;
    // After a few failures, poll REST meanwhile; either way the live feed
    // is tried again, with backoff, until it is back (a restarted daemon).
    if (!opened && state.retry >= 3) startPolling();
    else setState("offline", "reconnecting…");
    state.retryTimer = setTimeout(() => startFeed(true), backoff(state.retry));
  };
}

function startPolling() {
  setState("polling", "polling");
  const poll = async () => {
    try {
      const q = "?limit=" + state.limit + "&window=" + encodeURIComponent(state.window);
      const page = await getJSON("/v1/boards/" + encodeURIComponent(state.board) + "/top" + q);
      renderTop({ ...page, top: page.entries });
      if (state.follow) {
        try {
          const m = await getJSON("/v1/boards/" + encodeURIComponent(state.board) + "/members/" +
                                  encodeURIComponent(state.follow) + "?window=" +
                                  encodeURIComponent(state.window));
          renderFollowed({ member: m.member, rank: m.rank, score: m.score });
        } catch (error) { renderFollowed({ member: state.follow, rank: null }); }
      }
      setState("polling", "polling");
    } catch (error) { setState("offline", "offline"); }
  };
  poll();
  state.pollTimer = setInterval(poll, 2000);
}

async function loadBoards() {
  let boards = [];
  try {
    boards = (await getJSON("/v1/boards")).boards;
  } catch (error) {
    if (error.status === 401 || error.status === 403) {
      setState("offline", "needs a token");
      notice(credential ? "This token cannot read this server's boards."
                        : "This server needs a read token to show its boards.");
      $("token-form").hidden = false;
      return;
    }
    setState("offline", "offline");
    setTimeout(loadBoards, 2000);
    return;
  }
  state.boards = boards;
  const select = $("board");
  select.replaceChildren(...boards.map((b) => new Option(b.name, b.name)));
  if (!boards.length) { setState("offline", "no boards yet"); setTimeout(loadBoards, 2000); return; }
  const wanted = query.get("board");
  if (wanted && !boards.some((b) => b.name === wanted)) {
    setState("offline", "no such board");
    notice("There is no board named “" + wanted + "”: pick one.");
    select.value = "";
    select.onchange = () => { notice(""); pickBoard(boards.find((b) => b.name === select.value), true); };
    return;
  }
  if (wanted) select.value = wanted;
  pickBoard(boards.find((b) => b.name === select.value), false);
}

function pickBoard(board, fresh) {
  state.board = board.name;
  const windows = $("window");
  windows.replaceChildren(...board.config.windows.map((w) => new Option(w, w)));
  const primary = board.config.windows.includes("all") ? "all" : board.config.windows[0];
  if (fresh || !board.config.windows.includes(state.window)) state.window = primary;
  windows.value = state.window;
  $("limit").value = String(state.limit);
  if (state.follow) $("followed").textContent = "Following " + state.follow + "…";
  startFeed();
  $("board").onchange = () => pickBoard(state.boards.find((b) => b.name === $("board").value), true);
}

// Follow by what the page shows: a label shown in the top list stands for its member.
function follow(name) {
  state.follow = state.labels.get(name) || name || null;
  $("followed").textContent = state.follow ? "Following " + state.follow + "…" : "Nobody followed.";
  $("around").tBodies[0].replaceChildren();
  startFeed();
}

$("window").addEventListener("change", (e) => { state.window = e.target.value; startFeed(); });
$("limit").addEventListener("change", (e) => { state.limit = Number(e.target.value); startFeed(); });
$("follow-form").addEventListener("submit", (e) => {
  e.preventDefault();
  follow($("follow-name").value.trim());
});
$("top").tBodies[0].addEventListener("click", (e) => {
  const row = e.target.closest("tr");
  if (row && row.dataset.member) { $("follow-name").value = row.dataset.member; follow(row.dataset.member); }
});
$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const params = new URLSearchParams(location.search);
  params.set("token", $("token").value.trim());
  location.search = "?" + params;
});
loadBoards();
