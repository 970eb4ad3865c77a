// Runners (web.md): the user's runners, register (token shown once, with the start
// command), revoke.
import { api, get } from "./api.js";
import { el, isoTime, relativeTime, showError } from "./util.js";

const rowsNode = document.getElementById("runner-rows");
const emptyNode = document.getElementById("runners-empty");
const errorNode = document.getElementById("runner-error");
const registered = document.getElementById("registered");

async function load() {
  const [runners, sessions] = await Promise.all([
    get("/v1/runners"),
    get("/v1/sessions?limit=1000"),
  ]);
  const bound = new Map();
  for (const session of sessions.data) {
    if (!session.runner_id) continue;
    if (!bound.has(session.runner_id)) bound.set(session.runner_id, []);
    bound.get(session.runner_id).push(session);
  }
  rowsNode.replaceChildren(
    ...runners.data.map((runner) => row(runner, bound.get(runner.runner_id) ?? [])),
  );
  emptyNode.hidden = runners.data.length > 0;
}

function row(runner, sessions) {
  const seen = runner.last_seen_at;
  return el(
    "tr",
    { dataset: { id: runner.runner_id } },
    el(
      "td",
      {},
      el("strong", { class: "runner-name", text: runner.name || "(unnamed: named after its host when it connects)" }),
      // The raw id and version only in the details.
      el(
        "details",
        { class: "runner-details" },
        el("summary", { class: "muted", text: "Details" }),
        el("code", { class: "runner-id", text: runner.runner_id }),
        runner.runner_version ? el("span", { class: "muted", text: ` · version ${runner.runner_version}` }) : null,
      ),
    ),
    el(
      "td",
      {},
      el("span", { class: "dot", dataset: { online: runner.online ? "yes" : "no" } }),
      runner.online ? " online" : " offline",
    ),
    el(
      "td",
      {},
      seen ? el("time", { datetime: isoTime(seen), text: relativeTime(seen) }) : "never",
    ),
    el(
      "td",
      {},
      sessions.length
        ? el(
            "ul",
            { class: "plain" },
            sessions.map((session) =>
              el(
                "li",
                {},
                el("a", {
                  href: `/s/${encodeURIComponent(session.id)}`,
                  text: session.title || session.id,
                }),
              ),
            ),
          )
        : "—",
    ),
    el(
      "td",
      {},
      el("button", {
        type: "button",
        class: "danger",
        text: "Revoke",
        "aria-label": `Revoke ${runner.name || "this runner"}`,
        onclick: () => revoke(runner),
      }),
    ),
  );
}

async function revoke(runner) {
  if (!window.confirm(`Revoke ${runner.name || "this runner"}? Its token stops working.`)) {
    return;
  }
  try {
    await api("DELETE", `/v1/runners/${encodeURIComponent(runner.runner_id)}`);
    await load();
  } catch (error) {
    showError(errorNode, error);
  }
}

document.getElementById("register-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError(errorNode, null);
  const name = document.getElementById("runner-name").value.trim();
  try {
    const created = await api("POST", "/v1/runners", name ? { name } : {});
    document.getElementById("start-command").textContent = created.start_command ?? "";
    document.getElementById("binding-token").textContent = created.binding_token;
    registered.hidden = false;
    await load();
  } catch (error) {
    showError(errorNode, error);
  }
});

document.getElementById("copy-command").addEventListener("click", () => {
  navigator.clipboard?.writeText(document.getElementById("start-command").textContent);
});

load().catch((error) => showError(errorNode, error));
