// The session list (web.md, Sessions): newest activity first, search and status filter,
// live through GET /v1/sessions/updates.
import { get } from "./api.js";
import { EventStream } from "./sse.js";
import { el, isoTime, relativeTime } from "./util.js";

const list = document.getElementById("session-list");
const empty = document.getElementById("empty");
const search = document.getElementById("search");
const statusFilter = document.getElementById("status-filter");
const live = document.getElementById("live");

const rows = new Map(); // session id -> list row (the API's shape)

async function reload() {
  const page = await get("/v1/sessions?limit=1000&sort_by=updated_at&order=desc");
  rows.clear();
  for (const row of page.data) rows.set(row.id, row);
  render();
}

function matches(row) {
  const query = search.value.trim().toLowerCase();
  if (query && !(row.title ?? "").toLowerCase().includes(query)) return false;
  return !statusFilter.value || row.status === statusFilter.value;
}

function item(row) {
  const title = row.title || "Untitled session";
  const pending = row.pending_elicitations_count ?? 0;
  return el(
    "li",
    { class: "session-row", dataset: { id: row.id, status: row.status } },
    el(
      "a",
      { href: `/s/${encodeURIComponent(row.id)}`, class: "row-link" },
      el("span", { class: "row-title", text: title }),
      el("span", { class: "row-agent", text: row.agent_name }),
    ),
    el("span", { class: "badge", dataset: { status: row.status }, text: row.status }),
    pending > 0
      ? el("span", {
          class: "badge pending",
          title: `${pending} pending approval(s)`,
          text: `${pending} to approve`,
        })
      : null,
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
  );
}

function render() {
  const sorted = [...rows.values()].sort(
    (a, b) => b.updated_at - a.updated_at || (a.id < b.id ? 1 : -1),
  );
  const shown = sorted.filter(matches);
  list.replaceChildren(...shown.map(item));
  empty.hidden = rows.size > 0;
}

function onEvent(event) {
  if (event.type === "session.added" || event.type === "session.updated") {
    rows.set(event.session.id, event.session);
    render();
  } else if (event.type === "session.removed") {
    rows.delete(event.session_id);
    render();
  } else if (event.type === "session.resync") {
    reload();
  }
}

search.addEventListener("input", render);
statusFilter.addEventListener("change", render);
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
