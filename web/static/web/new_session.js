// New session (web.md): a bundle (file or drop) or an existing agent, a title and one of
// the user's online runners; creates, binds and opens the session page.
import { api, get } from "./api.js";
import { el, showError } from "./util.js";

const form = document.getElementById("new-form");
const bundleInput = document.getElementById("bundle");
const drop = document.getElementById("drop");
const agentSelect = document.getElementById("agent");
const runnerSelect = document.getElementById("runner");
const titleInput = document.getElementById("title");
const errorNode = document.getElementById("form-error");
const createButton = document.getElementById("create");

let dropped = null;

async function fill() {
  const [agents, runners] = await Promise.all([
    get("/v1/agents?limit=1000"),
    get("/v1/runners"),
  ]);
  for (const agent of agents.data) {
    agentSelect.append(el("option", { value: agent.id, text: agent.name }));
  }
  const online = runners.data.filter((runner) => runner.online);
  for (const runner of online) {
    runnerSelect.append(
      el("option", { value: runner.runner_id, text: runner.name || "unnamed runner" }),
    );
  }
  if (online.length === 1) runnerSelect.value = online[0].runner_id;
}

drop.addEventListener("dragover", (event) => {
  event.preventDefault();
  drop.classList.add("over");
});
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (event) => {
  event.preventDefault();
  drop.classList.remove("over");
  const file = event.dataTransfer?.files?.[0];
  if (file) {
    dropped = file;
    drop.querySelector(".muted").textContent = `${file.name} (${file.size} bytes)`;
  }
});
bundleInput.addEventListener("change", () => {
  dropped = null;
});

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  showError(errorNode, null);
  const file = dropped ?? bundleInput.files?.[0] ?? null;
  const title = titleInput.value.trim() || null;
  if (!file && !agentSelect.value) {
    showError(errorNode, new Error("Upload a bundle or pick an agent."));
    return;
  }
  createButton.disabled = true;
  try {
    let sessionId;
    if (file) {
      const body = new FormData();
      body.append("metadata", JSON.stringify(title ? { title } : {}));
      body.append("bundle", file, file.name);
      sessionId = (await api("POST", "/v1/sessions", undefined, { form: body })).session_id;
    } else {
      const payload = { agent_id: agentSelect.value };
      if (title) payload.title = title;
      sessionId = (await api("POST", "/v1/sessions", payload)).id;
    }
    if (runnerSelect.value) {
      await api("PATCH", `/v1/sessions/${encodeURIComponent(sessionId)}`, {
        runner_id: runnerSelect.value,
      });
    }
    window.location.assign(`/s/${encodeURIComponent(sessionId)}`);
  } catch (error) {
    showError(errorNode, error);
    createButton.disabled = false;
  }
});

fill().catch((error) => showError(errorNode, error));
