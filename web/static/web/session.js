// The session page (web.md, Session). Panels are modules of their own (transcript,
// changes, share); approval cards, attachments, the workspace tree and fork join the
// same way when their endpoints exist.
//
// Live with no gap and no duplicate: the session stream is opened first and its events
// are held until the snapshot is drawn; items are keyed by id, so what both deliver is
// drawn once. After a drop the stream reconnects with the last event id it saw; a
// `session.resync` (or a reconnect before any event id was seen) reloads the snapshot.
import { api, bootData, get } from "./api.js";
import { ApprovalCards } from "./approvals.js";
import { AttachmentChips, uploadAll } from "./attachments.js";
import { ChangesPanel } from "./changes.js";
import { ShareDialog } from "./share.js";
import { notify, refreshInbox } from "./inbox.js";
import { EventStream } from "./sse.js";
import { Transcript, flatten } from "./transcript.js";
import { el, formatTokens, formatUsd, isTransient, showError } from "./util.js";
import { WorkspacePanel } from "./workspace.js";

const boot = bootData();
const sessionId = boot.session_id;
const base = `/v1/sessions/${encodeURIComponent(sessionId)}`;

const $ = (id) => document.getElementById(id);
const transcript = new Transcript($("transcript"), { sessionId, onFork: fork });
const approvals = new ApprovalCards(sessionId, $("approvals"), {
  composer: $("composer"),
  onCount: drawTitle,
  onVerdict: (verdict) => transcript.verdict(verdict),
});
const workspace = new WorkspacePanel(sessionId);
const changes = new ChangesPanel(sessionId);
const share = new ShareDialog(sessionId);
const errorNode = $("session-error");
const message = $("message");

let session = null;
let held = []; // stream events that arrived before the snapshot was drawn
let loading = null;

async function loadSnapshot() {
  if (loading) return loading;
  loading = (async () => {
    held = held ?? [];
    const snapshot = await get(base);
    session = snapshot;
    drawMcp(snapshot.mcp_servers);
    transcript.reset();
    transcript.addMany(snapshot.items.map(flatten));
    drawQueue(snapshot.queued_turns ?? []);
    if (snapshot.status === "failed" && snapshot.last_task_error) {
      transcript.error("last", snapshot.last_task_error.message);
    }
    if (snapshot.status === "running" || snapshot.status === "waiting") {
      transcript.markQueued(snapshot.active_response_id);
    }
    drawHeader();
    approvals.reset(snapshot.pending_elicitations, snapshot.permission_level >= 2);
    if (snapshot.permission_level >= 2 || snapshot.share_workspace_files) {
      workspace
        .show({
          canEdit: snapshot.permission_level >= 2,
          bound: Boolean(snapshot.runner_id),
          canBind: snapshot.permission_level >= 4,
        })
        .catch(() => {});
    }
    const pending = held;
    held = null;
    for (const event of pending) apply(event);
    changes.reload().catch(() => {});
    approvals.loadVerdicts().catch(() => {});
    loadTurnEnds().catch(() => {});
    drawWorking();
    document.body.dataset.ready = "1";
    performance.mark("omnigent-session-ready");
    showSearchHit();
  })();
  try {
    await loading;
  } finally {
    loading = null;
  }
}

// Turns waiting for a runner slot show their place. A place moves when a turn ahead
// (of any session) starts, which this session's stream does not carry: while one
// waits, the place is read again every few seconds.
let queueTimer = null;
function drawQueue(queued) {
  transcript.places(queued);
  clearTimeout(queueTimer);
  if (!queued.length) return;
  queueTimer = setTimeout(() => {
    get(`${base}?include_items=false`)
      .then((fresh) => drawQueue(fresh.queued_turns ?? []))
      .catch(() => drawQueue(queued));
  }, 3000);
}

// A search result opens the session at its match: `#item-<id>` (sessions.js).
let hitShown = false;
function showSearchHit() {
  if (hitShown || !window.location.hash.startsWith("#item-")) return;
  hitShown = true;
  const itemId = decodeURIComponent(window.location.hash.slice("#item-".length));
  const node = [...$("transcript").querySelectorAll("[data-id]")].find(
    (entry) => entry.dataset.id === itemId,
  );
  if (!node) return;
  node.classList.add("search-hit");
  node.scrollIntoView({ block: "center" });
}

// Turns that were stopped or failed leave a trace after their last entry, after a reload
// too: read from the turns listing once the snapshot is drawn.
async function loadTurnEnds() {
  let after = null;
  let failedDrawn = false;
  for (;;) {
    const query = `?limit=100${after ? `&after=${encodeURIComponent(after)}` : ""}`;
    const page = await get(`${base}/responses${query}`);
    for (const turn of page.data) {
      if (turn.usage) transcript.usage(turn.id, turn.usage);
      if (turn.status === "cancelled") transcript.trace(turn.id, "stopped", "Stopped");
      else if (turn.status === "failed") {
        transcript.error(turn.id, turn.error?.message ?? "the turn failed");
        failedDrawn = true;
      }
    }
    if (!page.has_more || !page.last_id) break;
    after = page.last_id;
  }
  if (failedDrawn) transcript.dropTrace("last");
}

// While a turn runs and nothing streams yet, a line says the agent is working (and on
// which tool, when a tool card is still running).
function drawWorking() {
  const node = $("working");
  const text = session?.status === "running" && connected ? transcript.activity() : null;
  node.hidden = !text;
  node.textContent = text ?? "";
}

// The tab title leads with the number of questions waiting, "(1) title", so a question is
// seen from another tab.
function drawTitle() {
  if (!session) return;
  const waiting = approvals.count;
  const title = `${session.title || "Untitled session"} · Omnigent`;
  document.title = waiting ? `(${waiting}) ${title}` : title;
}

function drawHeader() {
  const level = session.permission_level;
  drawTitle();
  $("title").textContent = session.title || "Untitled session";
  $("agent").textContent = session.agent_name;
  drawCost();
  $("edit-title").hidden = level < 2;
  $("share").hidden = level < 3;
  drawStatus();
  drawRunner();
  drawWorking();
  $("composer").hidden = level < 2;
  if (level < 2) {
    $("composer-note").textContent = "";
    const note = $("session-error");
    note.textContent = "You have read access: you can watch this session.";
    note.hidden = false;
    note.classList.add("note");
  }
}

// The session's tokens and cost so far (docs/usage.md), from the snapshot and each
// `session.usage` event.
function drawCost() {
  const usage = session.usage;
  const budget = session.budget_usd ?? null;
  const node = $("cost");
  node.hidden = !usage && budget === null;
  // The session's own budget next to what it spent: "$0.12 of $2.50".
  const of = budget === null ? "" : ` of ${formatUsd(budget)}`;
  if (!usage) {
    node.textContent = `$0${of}`;
    node.title = "budget";
    return;
  }
  node.textContent = `${formatTokens(usage.total_tokens)} · ${formatUsd(usage.total_cost_usd)}${of}`;
  node.title = Object.entries(usage.by_model ?? {})
    .map(([model, used]) => `${model}: ${formatTokens(used.total_tokens)}, ${formatUsd(used.total_cost_usd)}`)
    .join("\n");
}

function drawStatus() {
  const status = $("status");
  status.textContent = session.status;
  status.dataset.status = session.status;
  // Out of touch with the server, the status is only the last one known.
  status.dataset.stale = connected ? "" : "1";
  status.title = connected ? "" : "last known status: the page is reconnecting";
  const busy = session.status === "running" || session.status === "waiting";
  $("stop").hidden = !busy || session.permission_level < 2;
  $("transcript").setAttribute("aria-busy", busy ? "true" : "false");
}

async function drawRunner() {
  const dot = $("runner-dot");
  const name = session.runner_name || "runner";
  if (!session.runner_id) {
    dot.dataset.online = "none";
    $("runner-label").textContent = "no runner";
  } else if (!connected) {
    // Nothing is known while the page cannot hear the server: no stale green.
    dot.dataset.online = "unknown";
    $("runner-label").textContent = `${name}: unknown while reconnecting`;
  } else {
    dot.dataset.online = session.runner_online ? "yes" : "no";
    $("runner-label").textContent = `${name} ${session.runner_online ? "online" : "offline"}`;
  }
  $("runner-label").title = session.runner_id ? `runner id ${session.runner_id}` : "";
  const select = $("runner-select");
  if (session.permission_level < 4) return;
  const runners = await get("/v1/runners").catch(() => ({ data: [] }));
  const options = [new Option("No runner", "")];
  for (const runner of runners.data) {
    if (runner.online || runner.runner_id === session.runner_id) {
      options.push(new Option(runner.name || "unnamed runner", runner.runner_id));
    }
  }
  select.replaceChildren(...options);
  select.value = session.runner_id ?? "";
  select.hidden = false;
}

function apply(event) {
  if (held) {
    held.push(event);
    return;
  }
  handle(event);
  drawWorking();
}

let stopRequested = null; // the turn this page asked to stop

function handle(event) {
  switch (event.type) {
    case "session.status":
      session.status = event.status;
      session.active_response_id = event.response_id;
      if (event.response_id && event.status === "running") transcript.started(event.response_id);
      drawStatus();
      if (event.status === "failed" && event.error) {
        transcript.error(event.response_id ?? "status", event.error.message);
      }
      break;
    case "session.input.consumed":
      transcript.add({ id: event.data.item_id, type: event.data.type, ...event.data.data });
      break;
    case "response.output_text.delta":
      transcript.delta(event.item_id, event.delta, event.response_id);
      break;
    case "response.created":
    case "response.in_progress":
      transcript.started(event.response.id);
      break;
    case "response.completed":
      if (event.response?.usage) transcript.usage(event.response.id, event.response.usage);
      break;
    case "session.usage":
      session.usage = event.usage;
      session.total_cost_usd = event.usage.total_cost_usd ?? null;
      drawCost();
      break;
    case "response.cancelled":
      if (event.response?.usage) transcript.usage(event.response.id, event.response.usage);
      transcript.trace(
        event.response.id,
        "stopped",
        stopRequested === event.response.id ? "Stopped by you" : "Stopped",
      );
      break;
    case "response.output_item.done":
      transcript.add(event.item);
      break;
    case "response.failed":
      if (event.response?.usage) transcript.usage(event.response.id, event.response.usage);
      if (event.response?.error) transcript.error(event.response.id, event.response.error.message);
      break;
    case "response.elicitation_request":
      approvals.requested(event);
      // The tab is hidden: a browser notification, if the user opted in (inbox.js).
      notify({
        key: `a:${event.elicitation_id}`,
        title: "A question is waiting",
        body: `${session.title || "Untitled session"}: ${event.params?.message ?? "the agent asks to run a tool"}`,
        session: sessionId,
      });
      refreshInbox().catch(() => {});
      break;
    case "response.elicitation_resolved":
      approvals.resolved(event);
      approvals.fetchVerdict(event.elicitation_id).catch(() => {});
      refreshInbox().catch(() => {});
      break;
    case "session.changed_files.invalidated":
      changes.reload().catch(() => {});
      workspace.refresh();
      break;
    case "session.runner":
      runnerChanged(event);
      break;
    case "session.mcp_status":
      drawMcp(event.servers);
      break;
    case "session.queue":
      drawQueue(event.queued_turns);
      break;
    case "session.resync":
      held = [];
      loadSnapshot();
      break;
    default:
      break;
  }
}

// The session's MCP servers (mcp.md): each with its state, its tools and why it failed;
// their names also give MCP tool cards their server badge.
function drawMcp(servers) {
  const entries = Object.entries(servers ?? {});
  for (const [name] of entries) {
    transcript.mcpServers = new Set([...(transcript.mcpServers ?? []), name]);
  }
  $("panel-mcp").hidden = !entries.length;
  $("mcp-servers").replaceChildren(
    ...entries.map(([name, state]) =>
      el(
        "li",
        { class: "mcp", dataset: { name } },
        el("strong", { text: name }),
        " ",
        el("span", { class: "badge", dataset: { mcp: state.status }, text: state.status }),
        " ",
        el("span", { class: "muted", text: state.transport ?? "" }),
        state.tools?.length
          ? el("p", {
              class: "mcp-tools",
              text: state.tools.map((tool) => tool.slice(name.length + 2)).join(", "),
            })
          : null,
        state.error ? el("p", { class: "error", text: state.error }) : null,
      ),
    ),
  );
}

// The bound runner went on- or offline, or another tab bound one (`session.runner`, live
// only): the header says so, and what its absence caused is cleared once it is back.
function runnerChanged(event) {
  const before = session.runner_id;
  session.runner_id = event.runner_id;
  session.runner_name = event.runner_name;
  session.runner_online = event.runner_online;
  drawRunner();
  if (before !== session.runner_id && !$("panel-workspace").hidden) {
    workspace.setBound(Boolean(session.runner_id)).catch(() => {});
  }
  if (session.runner_id && session.runner_online) causeGone();
}

function causeGone() {
  if (isTransient(errorNode)) showError(errorNode, null);
  workspace.retry();
}

// Back in touch after a drop: what may have changed unheard (the runner's state is not
// replayed) is read again, without the transcript, and errors the outage caused go.
async function caughtUp({ reread = true } = {}) {
  if (reread) {
    const fresh = await get(`${base}?include_items=false`);
    const { items: _items, pending_elicitations: _pending, ...row } = fresh;
    session = { ...session, ...row };
    drawHeader();
    changes.reload().catch(() => {});
  }
  if (errorNode.dataset.code === "network") showError(errorNode, null);
  if (!session.runner_id || session.runner_online) causeGone();
}

function drawConnection(state) {
  const node = $("connection");
  node.dataset.state = state;
  node.textContent = state === "live" ? "live" : state === "gone" ? "closed" : "reconnecting…";
  node.title = state === "live" ? "following the session as it happens" : "";
}

let everLive = false;
let connected = false;
const stream = new EventStream(`${base}/stream`, {
  onEvent: apply,
  onState(state, error) {
    $("session").dataset.stream = state;
    const wasConnected = connected;
    connected = state === "live";
    drawConnection(state);
    if (session && wasConnected !== connected) {
      drawStatus();
      drawRunner();
      drawWorking();
    }
    if (state === "gone") {
      showError(errorNode, new Error(error?.status === 404 ? "This session does not exist, or you have no access to it." : "You no longer have access to this session."));
      $("composer").hidden = true;
    } else if (state === "live") {
      if (!everLive || stream.lastId === null) {
        const again = everLive;
        everLive = true;
        if (!held) held = [];
        loadSnapshot()
          .then(() => again && caughtUp({ reread: false }))
          .catch((failure) => showError(errorNode, failure));
      } else if (session) {
        caughtUp().catch(() => {});
      }
    }
  },
});
window.omnigentSession = { stream, transcript };
stream.start();

// --- composer -------------------------------------------------------------------

async function send() {
  const text = message.value;
  const files = chips.files;
  if (!text.trim() && !files.length) return;
  $("send").disabled = true;
  showError(errorNode, null);
  try {
    const content = [];
    if (text.trim()) content.push({ type: "input_text", text });
    content.push(...(await uploadAll(sessionId, files)));
    const busy = session && (session.status === "running" || session.status === "waiting");
    const running = session?.active_response_id;
    const accepted = await api("POST", `${base}/events`, {
      type: "message",
      data: { role: "user", content },
    });
    // Sent while another turn runs: it waits for that one.
    if (busy && accepted?.response_id && accepted.response_id !== running) {
      transcript.queued(accepted.item_id, accepted.response_id);
    }
    message.value = "";
    chips.clear();
  } catch (error) {
    showError(errorNode, error);
  } finally {
    $("send").disabled = false;
    message.focus();
  }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
message.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
$("stop").addEventListener("click", async () => {
  try {
    stopRequested = session?.active_response_id ?? null;
    await api("POST", `${base}/events`, { type: "interrupt" });
  } catch (error) {
    showError(errorNode, error);
  }
});

// --- header controls --------------------------------------------------------------

$("edit-title").addEventListener("click", () => {
  $("title-input").value = session.title ?? "";
  $("title-form").hidden = false;
  $("edit-title").hidden = true;
  $("title-input").focus();
});
$("title-cancel").addEventListener("click", () => {
  $("title-form").hidden = true;
  $("edit-title").hidden = false;
});
$("title-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    const updated = await api("PATCH", base, { title: $("title-input").value.trim() || null });
    session = { ...session, ...updated };
    $("title-form").hidden = true;
    drawHeader();
  } catch (error) {
    showError(errorNode, error);
  }
});
$("runner-select").addEventListener("change", async (event) => {
  try {
    const updated = await api("PATCH", base, { runner_id: event.target.value });
    session = { ...session, ...updated };
    drawRunner();
    // What the missing runner caused is gone with it: the "no runner" error of a send,
    // and the workspace panel's note.
    if (session.runner_id && errorNode.dataset.code === "runner_unavailable") showError(errorNode, null);
    if (!$("panel-workspace").hidden) workspace.setBound(Boolean(session.runner_id)).catch(() => {});
  } catch (error) {
    showError(errorNode, error);
    drawRunner();
  }
});
const chips = new AttachmentChips($("attach"), $("chips"));
setInterval(() => transcript.tick(), 30000);

async function fork(responseId) {
  try {
    const body = responseId ? { up_to_response_id: responseId } : {};
    const created = await api("POST", `${base}/fork`, body);
    window.location.assign(`/s/${encodeURIComponent(created.id)}`);
  } catch (error) {
    showError(errorNode, error);
  }
}
$("fork").addEventListener("click", () => fork(null));
// The export with the session's files, as a download (lifecycle.md, Export and import).
$("export").href = `${base}/export?files=1`;

$("share").addEventListener("click", () => share.open().catch((error) => showError(errorNode, error)));
