// Schedules (automation.md): create a scheduled task with a preview of its next five
// times in the chosen zone, enable or disable, run now, and each task's run history
// with links to the sessions its runs started.
import { api, get } from "./api.js";
import { el, showError } from "./util.js";

const TASKS = "/v1/scheduled-tasks";
const form = document.getElementById("schedule-form");
const fields = {
  name: document.getElementById("sched-name"),
  agent: document.getElementById("sched-agent"),
  prompt: document.getElementById("sched-prompt"),
  rrule: document.getElementById("sched-rrule"),
  zone: document.getElementById("sched-zone"),
  budget: document.getElementById("sched-budget"),
};
const previewList = document.getElementById("sched-preview");
const previewError = document.getElementById("preview-error");
const errorNode = document.getElementById("schedule-error");
const rowsNode = document.getElementById("schedule-rows");
const emptyNode = document.getElementById("schedules-empty");
const history = document.getElementById("history");

// A time as people read it, on the clock of ``zone``.
function human(iso, zone) {
  if (!iso) return "—";
  try {
    return new Date(iso).toLocaleString(undefined, {
      timeZone: zone,
      weekday: "short",
      year: "numeric",
      month: "short",
      day: "numeric",
      hour: "2-digit",
      minute: "2-digit",
      timeZoneName: "short",
    });
  } catch {
    return iso;
  }
}

function fillZones() {
  const own = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  fields.zone.value = own;
  const names = Intl.supportedValuesOf ? Intl.supportedValuesOf("timeZone") : [own];
  document.getElementById("zone-names").replaceChildren(
    ...names.map((name) => el("option", { value: name })),
  );
}

async function fillAgents() {
  const agents = await get("/v1/agents?limit=1000");
  fields.agent.replaceChildren(
    ...agents.data.map((agent) => el("option", { value: agent.id, text: agent.name })),
  );
}

let previewTimer = null;
let previewSeq = 0;

function schedulePreview() {
  clearTimeout(previewTimer);
  previewTimer = setTimeout(preview, 250);
}

async function preview() {
  const seq = ++previewSeq;
  const zone = fields.zone.value.trim();
  try {
    const body = await api("POST", `${TASKS}/preview`, {
      rrule: fields.rrule.value,
      timezone: zone,
    });
    if (seq !== previewSeq) return;
    showError(previewError, null);
    previewList.replaceChildren(
      ...body.next_runs.map((iso) => el("li", {}, el("time", { datetime: iso, text: human(iso, zone) }))),
    );
  } catch (error) {
    if (seq !== previewSeq) return;
    previewList.replaceChildren();
    showError(previewError, error);
  }
}

async function load() {
  const body = await get(`${TASKS}?limit=1000`);
  rowsNode.replaceChildren(...body.scheduled_tasks.map(row));
  emptyNode.hidden = body.scheduled_tasks.length > 0;
}

function row(task) {
  const label = task.name;
  return el(
    "tr",
    { dataset: { id: task.id } },
    el("td", {}, el("strong", { text: label }), el("br"), el("span", { class: "muted", text: task.prompt })),
    el("td", {}, el("code", { text: task.rrule }), el("br"), el("span", { class: "muted", text: task.timezone })),
    el("td", {}, task.next_run_at
      ? el("time", { datetime: task.next_run_at, text: human(task.next_run_at, task.timezone) })
      : "—"),
    el(
      "td",
      {},
      el("input", {
        type: "checkbox",
        checked: task.enabled,
        "aria-label": `Enabled: ${label}`,
        onchange: (event) => setEnabled(task, event.target.checked),
      }),
    ),
    el(
      "td",
      { class: "actions" },
      el("button", { type: "button", text: "Run now", "aria-label": `Run ${label} now`, onclick: () => runNow(task) }),
      el("button", { type: "button", text: "History", "aria-label": `History of ${label}`, onclick: () => showHistory(task) }),
      el("button", { type: "button", class: "danger", text: "Delete", "aria-label": `Delete ${label}`, onclick: () => remove(task) }),
    ),
  );
}

async function act(work) {
  showError(errorNode, null);
  try {
    await work();
  } catch (error) {
    showError(errorNode, error);
  }
}

const setEnabled = (task, enabled) =>
  act(async () => {
    await api("PATCH", `${TASKS}/${encodeURIComponent(task.id)}`, { enabled });
    await load();
  });

const runNow = (task) =>
  act(async () => {
    await api("POST", `${TASKS}/${encodeURIComponent(task.id)}/run`);
    await showHistory(task);
  });

const remove = (task) =>
  act(async () => {
    if (!window.confirm(`Delete the scheduled task ${task.name}?`)) return;
    await api("DELETE", `${TASKS}/${encodeURIComponent(task.id)}`);
    if (history.dataset.task === task.id) history.hidden = true;
    await load();
  });

async function showHistory(task) {
  const body = await get(`${TASKS}/${encodeURIComponent(task.id)}/runs?limit=50`);
  history.dataset.task = task.id;
  document.getElementById("history-title").textContent = `Runs of ${task.name}`;
  document.getElementById("history-rows").replaceChildren(
    ...body.runs.map((run) =>
      el(
        "tr",
        { dataset: { id: run.id, status: run.status } },
        el("td", {}, el("time", { datetime: run.scheduled_for, text: human(run.scheduled_for, task.timezone) })),
        el("td", { text: run.trigger === "manual" ? `${run.status} (run now)` : run.status }),
        el("td", {}, run.session_id
          ? el("a", { href: `/s/${encodeURIComponent(run.session_id)}`, text: "open session" })
          : "—"),
        el("td", { class: "muted", text: run.error ?? "" }),
      ),
    ),
  );
  document.getElementById("history-empty").hidden = body.runs.length > 0;
  history.hidden = false;
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  act(async () => {
    const budget = fields.budget.value.trim();
    await api("POST", TASKS, {
      name: fields.name.value.trim(),
      agent_id: fields.agent.value,
      prompt: fields.prompt.value,
      rrule: fields.rrule.value,
      timezone: fields.zone.value.trim(),
      ...(budget ? { max_cost_usd: Number(budget) } : {}),
    });
    fields.name.value = "";
    fields.prompt.value = "";
    await load();
  });
});

fields.rrule.addEventListener("input", schedulePreview);
fields.zone.addEventListener("input", schedulePreview);
fillZones();
Promise.all([fillAgents(), load(), preview()]).catch((error) => showError(errorNode, error));
