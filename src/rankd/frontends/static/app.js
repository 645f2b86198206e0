// rankd live page: WebSocket first, polling REST as a fallback; no libraries.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { board: null, window: null, limit: 10, follow: null, socket: null,
                retry: 0, pollTimer: null, lastRanks: new Map(), version: 0 };

function setState(kind, text) {
  const el = $("state");
  el.className = "state " + kind;
  el.textContent = text;
}

// On a server with credentials, open the page as /?token=<a read token>: REST
// calls send it as a bearer token and the live feed gets a short join token.
const credential = new URLSearchParams(location.search).get("token");

async function getJSON(path) {
  const headers = { Accept: "application/json" };
  if (credential) headers.Authorization = "Bearer " + credential;
  const response = await fetch(path, { headers });
  if (!response.ok) throw new Error(path + ": " + response.status);
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
  for (const entry of message.top) {
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
}

async function startFeed() {
  stopFeed();
  state.version = 0;
  state.lastRanks = new Map();
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
    if (!opened && state.retry >= 3) { startPolling(); return; }
    const delay = Math.min(30000, 500 * 2 ** state.retry) * (0.5 + Math.random() / 2);
    setState("offline", "reconnecting…");
    setTimeout(() => { if (!state.socket && !state.pollTimer) startFeed(); }, delay);
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
  try { boards = (await getJSON("/v1/boards")).boards; } catch (error) { setState("offline", "offline"); }
  state.boards = boards;
  const select = $("board");
  select.replaceChildren(...boards.map((b) => new Option(b.name, b.name)));
  const wanted = new URLSearchParams(location.search).get("board");
  if (wanted && boards.some((b) => b.name === wanted)) select.value = wanted;
  if (!boards.length) { setState("offline", "no boards yet"); setTimeout(loadBoards, 2000); return; }
  pickBoard(boards.find((b) => b.name === select.value));
}

function pickBoard(board) {
  state.board = board.name;
  const windows = $("window");
  windows.replaceChildren(...board.config.windows.map((w) => new Option(w, w)));
  state.window = board.config.windows.includes("all") ? "all" : board.config.windows[0];
  windows.value = state.window;
  startFeed();
  $("board").onchange = () => pickBoard(state.boards.find((b) => b.name === $("board").value));
}

$("window").addEventListener("change", (e) => { state.window = e.target.value; startFeed(); });
$("limit").addEventListener("change", (e) => { state.limit = Number(e.target.value); startFeed(); });
$("follow-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const name = $("follow-name").value.trim();
  state.follow = name || null;
  $("followed").textContent = name ? "Following " + name + "…" : "Nobody followed.";
  $("around").tBodies[0].replaceChildren();
  startFeed();
});
loadBoards();
