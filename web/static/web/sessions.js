// The session list (web.md, Sessions): newest activity first, search and status filter,
// live through GET /v1/sessions/updates. The search box asks the server as you type
// (GET /v1/sessions?search_query=, debounced): titles and what was said; a result opens
// its session at the first matching item. "Show: Archived" (`?view=archived`) lists the
// archived sessions instead (`archived=1`); each row's ⋯ menu pins, archives or
// unarchives and deletes (session_menu.js). A row the user pinned says "Pinned"; a pin
// made anywhere (the session page's sidebar, another tab) arrives as `session.updated`.
import { api, get } from "./api.js";
import { rowMenu } from "./session_menu.js";
import { EventStream } from "./sse.js";
import { el, isoTime, relativeTime, showError } from "./util.js";

const list = document.getElementById("session-list");
const empty = document.getElementById("empty");
const search = document.getElementById("search");
const statusFilter = document.getElementById("status-filter");
const live = document.getElementById("live");
const viewFilter = document.getElementById("view-filter");
const listError = document.getElementById("list-error");
const emptyArchived = document.getElementById("empty-archived");
viewFilter.value = new URLSearchParams(window.location.search).get("view") === "archived" ? "archived" : "";
const archivedView = () => viewFilter.value === "archived";

const searchNote = document.getElementById("search-note");
const importForm = document.getElementById("import-form");
const importFile = document.getElementById("import-file");
const importError = document.getElementById("import-error");

const rows = new Map(); // session id -> list row (the API's shape)
const SEARCH_DELAY_MS = 250;
let results = null; // the rows the current search found, in the server's order; null: none
let searchTimer = null;
let searchRound = 0; // an answer to an older query than the box holds is dropped

async function reload() {
  const view = viewFilter.value;
  const page = await get(
    `/v1/sessions?limit=1000&sort_by=updated_at&order=desc${view === "archived" ? "&archived=1" : ""}`,
  );
  if (view !== viewFilter.value) return; // the view changed meanwhile: its own load draws
  rows.clear();
  for (const row of page.data) rows.set(row.id, row);
  document.body.dataset.view = view || "active";
  render();
}

// A row belongs to the view it is shown in: archived rows to "Archived", the rest to the
// default list. A live event or a menu action moves a row out of the view it left.
const inView = (row) => Boolean(row.archived) === archivedView();

function keep(row) {
  if (inView(row)) rows.set(row.id, row);
  else rows.delete(row.id);
  if (results) {
    results = results
      .map((found) =>
        found.id === row.id
          ? { ...row, search_snippet: found.search_snippet, search_item_id: found.search_item_id }
          : found,
      )
      .filter(inView);
  }
}

function forget(sessionId) {
  rows.delete(sessionId);
  if (results) results = results.filter((row) => row.id !== sessionId);
}

function matches(row) {
  return !statusFilter.value || row.status === statusFilter.value;
}

function onSearchInput() {
  clearTimeout(searchTimer);
  const query = search.value.trim();
  if (!query) {
    searchRound += 1;
    results = null;
    searchNote.hidden = true;
    render();
    return;
  }
  searchTimer = setTimeout(() => runSearch(query), SEARCH_DELAY_MS);
}

async function runSearch(query) {
  const round = ++searchRound;
  const path =
    "/v1/sessions?limit=100&sort_by=updated_at&order=desc&search_query=" +
    encodeURIComponent(query) +
    (archivedView() ? "&archived=1" : "");
  try {
    const page = await get(path);
    if (round !== searchRound) return;
    results = page.data;
    searchNote.textContent = results.length ? "" : `No session mentions “${query}”.`;
    searchNote.hidden = results.length > 0;
  } catch (error) {
    if (round !== searchRound) return;
    results = [];
    searchNote.textContent = error.message;
    searchNote.hidden = false;
  }
  document.body.dataset.searched = query;
  render();
}

// The snippet's matched words come between « and »; the text is never read as HTML.
function snippet(text) {
  const node = el("span", { class: "row-snippet" });
  text.split(/[«»]/).forEach((part, index) => {
    if (part) node.append(index % 2 ? el("mark", { text: part }) : part);
  });
  return node;
}

function item(row) {
  const title = row.title || "Untitled session";
  const pending = row.pending_elicitations_count ?? 0;
  let href = `/s/${encodeURIComponent(row.id)}`;
  if (row.search_item_id) href += `#item-${encodeURIComponent(row.search_item_id)}`;
  return el(
    "li",
    { class: "session-row", dataset: { id: row.id, status: row.status, pinned: row.pinned ? "1" : "0" } },
    el(
      "a",
      { href, class: "row-link" },
      el(
        "span",
        { class: "row-head" },
        el("span", { class: "row-title", text: title }),
        // A word, not only a colour or a glyph: the link's name then says it too.
        row.pinned ? el("span", { class: "badge pinned-mark", title: "Pinned in your list", text: "Pinned" }) : null,
      ),
      el("span", { class: "row-agent", text: row.agent_name }),
      row.search_snippet ? snippet(row.search_snippet) : null,
    ),
    el("span", { class: "badge", dataset: { status: row.status }, text: row.status }),
    pending > 0
      ? el("span", {
          class: "badge pending",
          title: `${pending} pending approval(s)`,
          text: `${pending} to approve`,
        })
      : el("span"),
    row.runner_id
      ? el("span", {
          class: "dot",
          dataset: { online: row.runner_online ? "yes" : "no" },
          title: `${row.runner_name ?? "runner"} ${row.runner_online ? "online" : "offline"}`,
          "aria-label": `${row.runner_name ?? "runner"} ${row.runner_online ? "online" : "offline"}`,
          role: "img",
        })
      : el("span", { class: "dot", dataset: { online: "none" }, title: "no runner" }),
    el("time", {
      class: "row-time",
      datetime: isoTime(row.updated_at),
      dataset: { ts: row.updated_at },
      text: relativeTime(row.updated_at),
    }),
    rowMenu(row, {
      onChange(changed) {
        showError(listError, null);
        keep(changed);
        render();
      },
      onDeleted(sessionId) {
        forget(sessionId);
        render();
      },
      onError: (error) => showError(listError, error),
    }),
  );
}

function render() {
  const sorted =
    results ??
    [...rows.values()].sort((a, b) => b.updated_at - a.updated_at || (a.id < b.id ? 1 : -1));
  const shown = sorted.filter(matches);
  list.replaceChildren(...shown.map(item));
  empty.hidden = rows.size > 0 || results !== null || archivedView();
  emptyArchived.hidden = rows.size > 0 || results !== null || !archivedView();
}

function onEvent(event) {
  if (event.type === "session.added" || event.type === "session.updated") {
    // A found row stays found, with its snippet; its other fields follow live.
    keep(event.session);
    render();
  } else if (event.type === "session.removed") {
    forget(event.session_id);
    render();
  } else if (event.type === "session.resync") {
    reload();
  }
}

search.addEventListener("input", onSearchInput);

// Import an export (lifecycle.md, Export and import): the new session opens.
importForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const file = importFile.files[0];
  if (!file) return;
  const form = new FormData();
  form.append("file", file);
  showError(importError, null);
  try {
    const created = await api("POST", "/v1/sessions/import", undefined, { form });
    window.location.assign(`/s/${encodeURIComponent(created.id)}`);
  } catch (error) {
    showError(importError, error);
  }
});
statusFilter.addEventListener("change", render);
viewFilter.addEventListener("change", () => {
  const url = new URL(window.location.href);
  if (archivedView()) url.searchParams.set("view", "archived");
  else url.searchParams.delete("view");
  window.history.replaceState(null, "", url);
  rows.clear();
  results = null;
  render();
  if (search.value.trim()) runSearch(search.value.trim());
  reload().catch((error) => showError(listError, error));
});
setInterval(() => {
  for (const node of list.querySelectorAll("time[data-ts]")) {
    node.textContent = relativeTime(Number(node.dataset.ts));
  }
}, 30000);

// The stream first (joined before the list is read), then the list: nothing is missed.
let first = true;
const stream = new EventStream("/v1/sessions/updates", {
  onEvent,
  onState(state) {
    live.textContent = state === "live" ? "live" : "reconnecting…";
    live.dataset.state = state;
    if (state === "live" && first) {
      first = false;
      reload();
    }
  },
});
window.omnigentUpdates = stream;
stream.start();
