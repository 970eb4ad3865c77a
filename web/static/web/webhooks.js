// Webhooks (automation.md): add one (the secret shown once), choose its events, enable
// or disable, send a test, delete; a webhook's deliveries with their status, redeliver.
import { api, get } from "./api.js";
import { el, isoTime, relativeTime, showError } from "./util.js";

const EVENT_TYPES = [
  "turn.completed",
  "turn.failed",
  "turn.cancelled",
  "approval.requested",
  "approval.resolved",
  "session.created",
  "session.deleted",
  "runner.online",
  "runner.offline",
  "budget.exceeded",
  "schedule.run_started",
  "schedule.run_finished",
];

const rowsNode = document.getElementById("webhook-rows");
const emptyNode = document.getElementById("webhooks-empty");
const errorNode = document.getElementById("webhook-error");
const eventsNode = document.getElementById("webhook-events");
const deliveriesNode = document.getElementById("deliveries");
const deliveryRows = document.getElementById("delivery-rows");
let shown = null;

for (const type of EVENT_TYPES) {
  eventsNode.append(
    el("label", {}, el("input", { type: "checkbox", value: type, name: "event" }), ` ${type}`),
  );
}

function chosenEvents() {
  if (document.getElementById("event-all").checked) return ["*"];
  return [...eventsNode.querySelectorAll("input[name=event]:checked")].map((box) => box.value);
}

async function load() {
  const webhooks = await get("/v1/webhooks");
  rowsNode.replaceChildren(...webhooks.data.map(row));
  emptyNode.hidden = webhooks.data.length > 0;
  if (shown && !webhooks.data.some((hook) => hook.id === shown)) {
    shown = null;
    deliveriesNode.hidden = true;
  }
}

function row(hook) {
  const label = hook.description || hook.url;
  const action = (text, onclick, extra = {}) =>
    el("button", { type: "button", text, "aria-label": `${text}: ${label}`, onclick, ...extra });
  return el(
    "tr",
    { dataset: { id: hook.id } },
    el(
      "td",
      {},
      el("strong", { text: hook.description || "(no description)" }),
      el("br"),
      el("code", { class: "muted", text: hook.url }),
    ),
    el("td", { text: hook.events.join(", ") }),
    el(
      "td",
      {},
      el("span", { class: "dot", dataset: { online: hook.enabled ? "yes" : "no" } }),
      hook.enabled ? " enabled" : " disabled",
      hook.disabled_reason ? el("div", { class: "muted", text: hook.disabled_reason }) : null,
    ),
    el(
      "td",
      { class: "inline" },
      action("Deliveries", () => showDeliveries(hook)),
      action("Send test", () => run(() => api("POST", path(hook, "/test")))),
      action(hook.enabled ? "Disable" : "Enable", () =>
        run(() => api("PATCH", path(hook), { enabled: !hook.enabled })),
      ),
      action("Delete", () => remove(hook), { class: "danger" }),
    ),
  );
}

const path = (hook, rest = "") => `/v1/webhooks/${encodeURIComponent(hook.id)}${rest}`;

async function run(change) {
  showError(errorNode, null);
  try {
    await change();
    await load();
    if (shown) await loadDeliveries();
  } catch (error) {
    showError(errorNode, error);
  }
}

async function remove(hook) {
  if (!window.confirm(`Delete the webhook to ${hook.url}?`)) return;
  await run(() => api("DELETE", path(hook)));
}

async function showDeliveries(hook) {
  shown = hook.id;
  document.getElementById("deliveries-of").textContent = hook.description || hook.url;
  deliveriesNode.hidden = false;
  await run(() => Promise.resolve());
}

async function loadDeliveries() {
  const page = await get(`/v1/webhooks/${encodeURIComponent(shown)}/deliveries?limit=50`);
  deliveryRows.replaceChildren(...page.data.map(deliveryRow));
  document.getElementById("deliveries-empty").hidden = page.data.length > 0;
}

function deliveryRow(delivery) {
  const answer =
    delivery.last_status_code !== null
      ? `HTTP ${delivery.last_status_code}`
      : delivery.last_error || "—";
  return el(
    "tr",
    { dataset: { id: delivery.id, status: delivery.status } },
    el(
      "td",
      {},
      el("strong", { text: delivery.type }),
      el("br"),
      el("time", {
        datetime: isoTime(delivery.created_at),
        text: relativeTime(delivery.created_at),
      }),
    ),
    el("td", {}, el("span", { class: "badge delivery-status", text: delivery.status })),
    el("td", { text: String(delivery.attempts) }),
    el(
      "td",
      {},
      answer,
      delivery.latency_ms !== null ? el("span", { class: "muted", text: ` · ${delivery.latency_ms} ms` }) : null,
    ),
    el(
      "td",
      {},
      el("button", {
        type: "button",
        text: "Redeliver",
        "aria-label": `Redeliver ${delivery.type} ${delivery.event_id}`,
        onclick: () =>
          run(() =>
            api(
              "POST",
              `/v1/webhooks/${encodeURIComponent(shown)}/deliveries/${encodeURIComponent(delivery.id)}/redeliver`,
            ),
          ),
      }),
    ),
  );
}

document.getElementById("webhook-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError(errorNode, null);
  const description = document.getElementById("webhook-description").value.trim();
  const body = { url: document.getElementById("webhook-url").value.trim(), events: chosenEvents() };
  if (description) body.description = description;
  try {
    const created = await api("POST", "/v1/webhooks", body);
    document.getElementById("webhook-secret").textContent = created.secret;
    document.getElementById("webhook-created").hidden = false;
    event.target.reset();
    await load();
  } catch (error) {
    showError(errorNode, error);
  }
});

load().catch((error) => showError(errorNode, error));
