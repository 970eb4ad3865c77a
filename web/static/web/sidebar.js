// The sidebar of the session page (web.md, Sidebar): the user's sessions, pinned first
// then newest activity, live through GET /v1/sessions/updates; a search box that asks the
// server (search_query, debounced); "waiting for you" counts from GET /v1/inbox (read by
// inbox.js, read again when a row's questions or status change); a ⋯ menu per row. At
// narrow widths it folds behind a toggle.
import { api, bootData, get } from "./api.js";
import { onInbox, refreshInbox } from "./inbox.js";
import { pinnedFirst, rowMenu } from "./session_menu.js";
import { EventStream } from "./sse.js";
import { el, showError } from "./util.js";

const $ = (id) => document.getElementById(id);
const nav = $("sidebar");
const list = $("side-list");
const search = $("side-search");
const note = $("side-note");
const empty = $("side-empty");
const errorNode = $("side-error");
const toggle = $("side-toggle");
const waitingNode = $("side-waiting");
const current = bootData().session_id ?? null;

const SEARCH_DELAY_MS = 250;
const RECENT = 50;
// session id -> list row (unarchived, as GET /v1/sessions has them), newest change first:
// the rows' times are whole seconds, so the order among equal times is this one.
let rows = new Map();
let results = null; // the rows the current search found; null: no search
let waiting = new Map(); // session id -> how many things wait for the user there
let searchTimer = null;
let searchRound = 0;
let inboxTimer = null;

// Every pinned session, and the newest RECENT of all (the sessions list has the rest).
async function reload() {
  const newest = "/v1/sessions?sort_by=updated_at&order=desc";
  const [pinned, recent] = await Promise.all([
    get(`${newest}&pinned=1&limit=1000`),
    get(`${newest}&limit=${RECENT}`),
  ]);
  rows = new Map();
  for (const row of [...recent.data, ...pinned.data]) rows.set(row.id, row);
  render();
}

function item(row) {
  const title = row.title || "Untitled session";
  const count = waiting.get(row.id) ?? 0;
  let href = `/s/${encodeURIComponent(row.id)}`;
  if (row.search_item_id) href += `#item-${encodeURIComponent(row.search_item_id)}`;
  const link = el(
    "a",
    { href, class: "side-link", "aria-current": row.id === current ? "page" : null },
    el("span", { class: "side-title", text: title }),
    row.search_snippet ? el("span", { class: "side-snippet", text: row.search_snippet.replace(/[«»]/g, "") }) : null,
  );
  return el(
    "li",
    { class: "side-row", dataset: { id: row.id, status: row.status, pinned: row.pinned ? "1" : "0" } },
    link,
    el("span", { class: "side-status", dataset: { status: row.status }, title: row.status, "aria-label": row.status, role: "img" }),
    count
      ? el("span", { class: "badge pending side-count", title: `${count} waiting for you`, text: String(count) })
      : null,
    rowMenu(row, {
      onChange: changed,
      onDeleted: deleted,
      onError: (error) => showError(errorNode, error),
    }),
  );
}

// Pinned rows come first under "Pinned", the others under "Recent" (a search's results
// keep the server's order, ungrouped).
function render() {
  const shown = results ?? [...rows.values()].sort(pinnedFirst);
  const focused = document.activeElement?.closest?.(".side-row")?.dataset.id;
  const nodes = [];
  shown.forEach((row, index) => {
    if (results === null && shown[0].pinned && (index === 0 || row.pinned !== shown[index - 1].pinned)) {
      nodes.push(el("li", { class: "side-group", text: row.pinned ? "Pinned" : "Recent" }));
    }
    nodes.push(item(row));
  });
  list.replaceChildren(...nodes);
  if (focused) list.querySelector(`.side-row[data-id="${CSS.escape(focused)}"] .menu-button`)?.focus();
  empty.hidden = results !== null || rows.size > 0;
  let total = 0;
  for (const count of waiting.values()) total += count;
  waitingNode.textContent = total ? `${total} waiting for you` : "";
  waitingNode.hidden = total === 0;
}

// A row the menu changed: shown at once (the stream's event follows with the same row).
function changed(row) {
  showError(errorNode, null);
  if (row.archived) {
    rows.delete(row.id);
    showNote(`Archived “${row.title || "Untitled session"}”.`, row);
  } else {
    rows.set(row.id, { ...(rows.get(row.id) ?? {}), ...row });
  }
  if (results) results = results.map((found) => (found.id === row.id ? { ...found, ...row } : found)).filter((found) => !found.archived);
  render();
}

function showNote(text, row) {
  note.replaceChildren(
    text + " ",
    el("button", {
      type: "button",
      class: "link",
      id: "side-undo",
      text: "Undo",
      onclick: async () => {
        try {
          const answer = await api("PATCH", `/v1/sessions/${encodeURIComponent(row.id)}`, { archived: false });
          note.hidden = true;
          changed({ ...row, archived: answer.archived });
        } catch (error) {
          showError(errorNode, error);
        }
      },
    }),
    " · ",
    el("a", { href: "/?view=archived", text: "Archived sessions" }),
  );
  note.hidden = false;
}

function deleted(sessionId) {
  if (sessionId === current) {
    window.location.assign("/");
    return;
  }
  rows.delete(sessionId);
  if (results) results = results.filter((row) => row.id !== sessionId);
  render();
}

function onSearchInput() {
  clearTimeout(searchTimer);
  const query = search.value.trim();
  if (!query) {
    searchRound += 1;
    results = null;
    note.hidden = true;
    delete nav.dataset.searched;
    render();
    return;
  }
  searchTimer = setTimeout(() => runSearch(query), SEARCH_DELAY_MS);
}

async function runSearch(query) {
  const round = ++searchRound;
  try {
    const page = await get(
      "/v1/sessions?limit=50&sort_by=updated_at&order=desc&search_query=" + encodeURIComponent(query),
    );
    if (round !== searchRound) return;
    results = page.data;
    note.textContent = results.length ? "" : `Nothing mentions “${query}”.`;
    note.hidden = results.length > 0;
  } catch (error) {
    if (round !== searchRound) return;
    results = [];
    note.textContent = error.message;
    note.hidden = false;
  }
  nav.dataset.searched = query;
  render();
}

// What the inbox holds, per session: its open questions for the user and a failed turn.
onInbox((inbox) => {
  const counts = new Map();
  for (const row of inbox.approvals) counts.set(row.session_id, (counts.get(row.session_id) ?? 0) + 1);
  for (const row of inbox.failed) counts.set(row.session_id, (counts.get(row.session_id) ?? 0) + 1);
  waiting = counts;
  render();
});

// A row whose questions or status changed changes what waits: read the inbox again
// (once for a burst of changes).
function inboxMayHaveChanged(before, after) {
  if (before && before.pending_elicitations_count === after.pending_elicitations_count && before.status === after.status) return;
  clearTimeout(inboxTimer);
  inboxTimer = setTimeout(() => refreshInbox().catch(() => {}), 200);
}

function onEvent(event) {
  if (event.type === "session.added" || event.type === "session.updated") {
    const row = event.session;
    const before = rows.get(row.id);
    rows.delete(row.id);
    if (!row.archived) rows = new Map([[row.id, row], ...rows]);
    if (results) {
      results = results
        .map((found) => (found.id === row.id ? { ...row, search_snippet: found.search_snippet, search_item_id: found.search_item_id } : found))
        .filter((found) => !found.archived);
    }
    inboxMayHaveChanged(before, row);
    render();
  } else if (event.type === "session.removed") {
    rows.delete(event.session_id);
    if (results) results = results.filter((row) => row.id !== event.session_id);
    if (waiting.delete(event.session_id)) refreshInbox().catch(() => {});
    render();
  } else if (event.type === "session.resync") {
    reload().catch((error) => showError(errorNode, error));
  }
}

// Folded at narrow widths (CSS decides when the toggle shows): open or close the list.
toggle.addEventListener("click", () => {
  const open = nav.dataset.open !== "1";
  nav.dataset.open = open ? "1" : "0";
  toggle.setAttribute("aria-expanded", String(open));
});
search.addEventListener("input", onSearchInput);

let first = true;
const stream = new EventStream("/v1/sessions/updates", {
  onEvent,
  onState(state) {
    nav.dataset.live = state;
    if (state === "live" && first) {
      first = false;
      reload()
        .then(() => {
          nav.dataset.ready = "1";
        })
        .catch((error) => showError(errorNode, error));
    }
  },
});
window.omnigentSidebar = stream;
stream.start();
