// The transcript as a conversation (web.md, Session): user messages, the assistant's
// Markdown, tool calls as collapsible cards (name, arguments, output, duration, status),
// errors in red. Items are keyed by id, so an item seen twice (snapshot and stream, or a
// replay after a reconnect) is replaced, never shown twice.
import { renderMarkdown } from "./markdown.js";
import { el, relativeTime, usageLine } from "./util.js";

export class Transcript {
  constructor(root, { sessionId, onFork } = {}) {
    this.root = root;
    this.sessionId = sessionId;
    this.onFork = onFork;
    this.nodes = new Map(); // item id -> <li>
    // turn + call_id -> { card, startedAt, output, … }: some servers reuse call ids across
    // turns (`call_0` every time), so a call id alone names no card.
    this.calls = new Map();
    this.streaming = new Map(); // item id -> { text, node, scheduled }
    this.done = new Set(); // item ids already final
    // turn + call_id -> "approved by …": who answered a call's approval, drawn on its card.
    // Kept across a reset: the answers are read once, an answer does not change.
    this.verdicts = new Map();
    this.waiting = new Map(); // item id -> the queued turn it waits for, before it is drawn
  }

  reset() {
    this.nodes.clear();
    this.calls.clear();
    this.streaming.clear();
    this.done.clear();
    this.root.replaceChildren();
  }

  // Items in the flat shape (the snapshot's nested ones are flattened by the caller).
  addMany(items) {
    const fragment = document.createDocumentFragment();
    for (const item of items) this.add(item, fragment);
    this.root.append(fragment);
  }

  add(item, parent = this.root) {
    this.done.add(item.id);
    this.streaming.delete(item.id);
    if (item.type === "function_call_output") {
      this.attachOutput(item);
      return;
    }
    const node = this.render(item);
    if (!node) return;
    const existing = this.nodes.get(item.id);
    if (existing) existing.replaceWith(node);
    else parent.append(node);
    this.nodes.set(item.id, node);
    const waitsFor = this.waiting.get(item.id) ?? existing?.dataset.queuedFor;
    if (waitsFor) {
      this.waiting.delete(item.id);
      this.queued(item.id, waitsFor);
    }
  }

  dropTrace(id) {
    this.nodes.get(`error-${id}`)?.remove();
    this.nodes.delete(`error-${id}`);
  }

  render(item) {
    if (item.type === "message") return this.message(item);
    if (item.type === "function_call") return this.call(item);
    if (item.type === "reasoning") return null;
    return el(
      "li",
      { class: "entry other", dataset: { id: item.id } },
      el("details", {}, el("summary", { text: item.type }), el("pre", { text: JSON.stringify(item, null, 2) })),
    );
  }

  message(item) {
    const role = item.role ?? "user";
    const text = (item.content ?? [])
      .map((part) => (typeof part === "string" ? part : part.text ?? ""))
      .join("");
    const body = el("div", { class: "bubble" });
    if (role === "assistant") body.append(renderMarkdown(text));
    else body.textContent = text;
    const files = (item.content ?? []).filter(
      (part) => part?.type === "input_file" || part?.type === "input_image",
    );
    const fork =
      role === "assistant" && item.response_id && this.onFork
        ? el("button", {
            type: "button",
            class: "link fork-here",
            text: "Fork from here",
            onclick: () => this.onFork(item.response_id),
          })
        : null;
    // An answer cut short (its model call failed mid-stream) is kept as it was seen,
    // marked so nobody takes it for the whole answer.
    const incomplete = item.status === "incomplete";
    if (incomplete) body.classList.add("incomplete");
    if (role === "assistant") addCodeCopies(body);
    return el(
      "li",
      {
        class: `entry ${role === "assistant" ? "assistant" : "user"}${incomplete ? " incomplete" : ""}`,
        dataset: { id: item.id, responseId: item.response_id ?? undefined },
      },
      // An item drawn live may come without its time (a consumed input): it is now.
      head(role === "assistant" ? "Agent" : item.created_by || "You", item.created_at ?? Date.now() / 1000, () => text),
      body,
      incomplete
        ? el("span", { class: "incomplete-note", text: "Incomplete: the answer was cut off here." })
        : null,
      files.length
        ? el(
            "ul",
            { class: "attachments" },
            files.map((part) =>
              el(
                "li",
                {},
                el("a", {
                  href: `/v1/sessions/${encodeURIComponent(this.sessionId)}/resources/files/${encodeURIComponent(part.file_id)}/content`,
                  download: part.filename ?? "",
                  text: `Attached: ${part.filename ?? part.file_id}`,
                }),
              ),
            ),
          )
        : null,
      fork,
    );
  }

  call(item) {
    const key = callKey(item);
    const previous = this.calls.get(key);
    // A card drawn again (snapshot, then stream) keeps when its call was first seen.
    const startedAt = (previous?.card ? previous.startedAt : item.created_at) ?? Date.now() / 1000;
    let args = item.arguments ?? "";
    try {
      args = JSON.stringify(JSON.parse(args), null, 2);
    } catch {
      // not JSON: shown as sent
    }
    // The call item is complete once the model made it; until its output arrives the
    // tool is still running (or waiting for an approval); then its output says what
    // became of it.
    const shown =
      previous?.output != null
        ? outcome(previous.output)
        : item.status === "completed"
          ? RUNNING
          : label(item.status);
    const status = el("span", { class: "call-status", dataset: { status: shown.status }, text: shown.label });
    const output = el("pre", { class: "call-output", text: previous?.output ?? "" });
    const images = el("div", { class: "call-images" });
    drawImages(images, previous?.images);
    const duration = el("span", { class: "call-duration" });
    // Under the summary line (which does not wrap), so a long name or reason fits at 390 px.
    const verdict = el("p", { class: "call-verdict muted", text: this.verdicts.get(key) ?? "" });
    verdict.hidden = !verdict.textContent;
    const card = el(
      "li",
      {
        class: "entry tool",
        dataset: { id: item.id, callId: item.call_id, responseId: item.response_id ?? undefined },
      },
      el(
        "details",
        {},
        el("summary", {}, ...this.toolName(item.name), status, duration),
        el("h4", { text: "Arguments" }),
        el("pre", { class: "call-args", text: args }),
        el("h4", { text: "Output" }),
        output,
        images,
      ),
      verdict,
    );
    const entry = {
      card,
      startedAt,
      output: previous?.output ?? null,
      images: previous?.images,
      status,
      outputNode: output,
      imagesNode: images,
      duration,
      verdict,
    };
    this.calls.set(key, entry);
    if (previous?.finishedAt) this.finish(entry, previous.finishedAt);
    return card;
  }

  // An MCP tool's card names its server as a badge, then the server's own tool name.
  toolName(name) {
    const server = [...(this.mcpServers ?? [])].find((server) => name.startsWith(`${server}__`));
    if (!server) return [el("span", { class: "tool-name", text: name })];
    return [
      el("span", { class: "badge mcp-server", title: "MCP server", text: server }),
      el("span", { class: "tool-name", text: name.slice(server.length + 2) }),
    ];
  }

  attachOutput(item) {
    const key = callKey(item);
    let entry = this.calls.get(key);
    if (!entry) {
      // The output came first: kept for the call's card.
      entry = {
        output: item.output ?? "",
        images: item.images,
        finishedAt: item.created_at ?? Date.now() / 1000,
      };
      this.calls.set(key, entry);
      return;
    }
    entry.output = item.output ?? "";
    entry.outputNode.textContent = entry.output;
    entry.images = item.images;
    drawImages(entry.imagesNode, item.images);
    const shown = outcome(entry.output);
    entry.status.textContent = shown.label;
    entry.status.dataset.status = shown.status;
    this.finish(entry, item.created_at ?? Date.now() / 1000);
  }

  // Who answered a call's approval ("approved by alice", "declined by alice: not now"),
  // beside the call, as the audit records it; the card may be drawn before or after.
  verdict({ response_id, call_id, text }) {
    const key = callKey({ response_id, call_id });
    this.verdicts.set(key, text);
    const entry = this.calls.get(key);
    if (!entry?.verdict) return;
    entry.verdict.textContent = text;
    entry.verdict.hidden = false;
  }

  finish(entry, finishedAt) {
    entry.finishedAt = finishedAt;
    const seconds = Math.max(0, finishedAt - entry.startedAt);
    entry.duration.textContent = seconds < 1 ? "<1 s" : `${Math.round(seconds)} s`;
  }

  // Streaming text: appended as it arrives; rendered as Markdown at most once a frame.
  delta(itemId, text, responseId) {
    if (this.done.has(itemId)) return;
    let entry = this.streaming.get(itemId);
    if (!entry) {
      const bubble = el("div", { class: "bubble streaming" });
      const node = el(
        "li",
        { class: "entry assistant", dataset: { id: itemId, responseId } },
        head("Agent", Date.now() / 1000, () => entry.text),
        bubble,
      );
      this.root.append(node);
      this.nodes.set(itemId, node);
      entry = { text: "", bubble, scheduled: false };
      this.streaming.set(itemId, entry);
    }
    entry.text += text;
    if (!entry.scheduled) {
      entry.scheduled = true;
      requestAnimationFrame(() => {
        entry.scheduled = false;
        if (this.streaming.get(itemId) !== entry) return;
        entry.bubble.replaceChildren(renderMarkdown(entry.text));
        addCodeCopies(entry.bubble);
      });
    }
  }

  error(id, message) {
    this.trace(id, "failed", `Failed: ${message}`);
  }

  // What a finished turn used and cost, under its answer (docs/usage.md): drawn once
  // per turn, redrawn with newer numbers.
  usage(responseId, usage) {
    const text = usageLine(usage);
    if (!text) return;
    const key = `usage-${responseId}`;
    const node = el("li", {
      class: "entry usage-line",
      dataset: { usageFor: responseId },
      title: usage.model ? `model ${usage.model}` : "",
      text,
    });
    const existing = this.nodes.get(key);
    if (existing) {
      existing.replaceWith(node);
    } else {
      const entries = this.root.querySelectorAll(`li[data-response-id="${CSS.escape(responseId)}"]`);
      const last = entries[entries.length - 1];
      if (last) last.after(node);
      else this.root.append(node);
    }
    this.nodes.set(key, node);
  }

  // How a turn ended when it did not complete: "Stopped by you" (or "Stopped"), or
  // "Failed: <error>", after the turn's last entry; once per turn.
  trace(responseId, kind, text) {
    const key = `error-${responseId}`;
    if (this.nodes.has(key)) return;
    // The session's failure ("status", "last": no turn named) and its turn's say the
    // same: drawn once, for the turn.
    const generic = GENERIC.has(responseId);
    const same = [...this.root.querySelectorAll("li[data-trace=failed]")].filter((n) => n.textContent === text);
    if (generic && same.length) return;
    for (const node of same) {
      if (GENERIC.has(node.dataset.responseId)) this.dropTrace(node.dataset.responseId);
    }
    const node = el("li", {
      class: `entry ${kind === "failed" ? "error" : "stopped"}`,
      role: kind === "failed" ? "alert" : "status",
      dataset: { trace: kind, responseId },
      text,
    });
    const entries = this.root.querySelectorAll(`li[data-response-id="${CSS.escape(responseId)}"]`);
    const last = entries[entries.length - 1];
    if (last) last.after(node);
    else this.root.append(node);
    this.nodes.set(key, node);
  }

  // A message sent while another turn runs waits for it: marked "queued" until its own
  // turn starts (`started`).
  queued(itemId, responseId) {
    const node = this.nodes.get(itemId);
    if (!node) {
      this.waiting.set(itemId, responseId); // its entry is drawn when the stream says so
      return;
    }
    if (node.querySelector(".queued-note")) return;
    node.dataset.queuedFor = responseId;
    node.querySelector(".entry-head")?.append(el("span", { class: "queued-note", text: "queued" }));
  }

  started(responseId) {
    for (const node of this.root.querySelectorAll(`li[data-queued-for="${CSS.escape(responseId)}"]`)) {
      delete node.dataset.queuedFor;
      node.querySelector(".queued-note")?.remove();
    }
  }

  // Turns waiting for a runner slot (the snapshot's `queued_turns`, `session.queue`):
  // each one's message says its place in the runner's queue; the others say nothing.
  places(queuedTurns) {
    const places = new Map(queuedTurns.map((turn) => [turn.response_id, turn.position]));
    for (const node of this.root.querySelectorAll("li.entry.user[data-response-id]")) {
      const position = places.get(node.dataset.responseId);
      let note = node.querySelector(".queue-place");
      if (!position) {
        note?.remove();
        continue;
      }
      if (!note) {
        note = el("span", { class: "queued-note queue-place" });
        node.querySelector(".entry-head")?.append(note);
      }
      note.textContent = position === 1 ? "waiting for a runner: next" : `waiting for a runner: #${position}`;
      note.title = "the runner runs as many turns at once as it declared; this one starts when a slot frees";
    }
  }

  // The snapshot of a busy session: user messages of turns after the running one wait.
  markQueued(activeResponseId) {
    if (!activeResponseId) return;
    let seen = false;
    for (const node of this.root.querySelectorAll("li.entry.user[data-response-id]")) {
      const id = node.dataset.responseId;
      if (id === activeResponseId) seen = true;
      else if (seen) this.queued(node.dataset.id, id);
    }
  }

  // Relative times ("3 min ago") kept current; the exact time is in the tooltip.
  tick() {
    for (const node of this.root.querySelectorAll("time[data-ts]")) {
      node.textContent = relativeTime(Number(node.dataset.ts));
    }
  }

  // What the agent is doing while a turn runs and nothing streams: the tool whose card is
  // still running, else "working". Null when text is streaming.
  activity() {
    for (const entry of this.streaming.values()) if (entry.text) return null;
    const running = [...this.root.querySelectorAll(".entry.tool .call-status[data-status=running]")].pop();
    const name = running?.closest(".entry.tool")?.querySelector(".tool-name")?.textContent;
    return name ? `Running ${name}…` : "Working…";
  }
}

// An entry's head line: who, when (relative; exact on hover) and a Copy button.
function head(who, createdAt, text) {
  const when = createdAt
    ? el("time", {
        datetime: new Date(createdAt * 1000).toISOString(),
        title: new Date(createdAt * 1000).toLocaleString(),
        dataset: { ts: createdAt },
        text: relativeTime(createdAt),
      })
    : null;
  return el(
    "div",
    { class: "entry-head" },
    el("span", { class: "who", text: who }),
    when,
    copyButton(text, "Copy message"),
  );
}

function copyButton(text, label) {
  const button = el("button", {
    type: "button",
    class: "link copy",
    "aria-label": label,
    text: "Copy",
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(text());
        button.textContent = "Copied";
      } catch {
        button.textContent = "Copy failed";
      }
      setTimeout(() => (button.textContent = "Copy"), 1500);
    },
  });
  return button;
}

// A Copy button on each code block of rendered Markdown.
export function addCodeCopies(container) {
  for (const pre of container.querySelectorAll("pre")) {
    if (pre.parentElement?.classList.contains("code-box")) continue;
    const box = el("div", { class: "code-box" });
    pre.replaceWith(box);
    box.append(copyButton(() => pre.textContent, "Copy code"), pre);
  }
}

const RUNNING = { status: "running", label: "running" };
const GENERIC = new Set(["status", "last"]);
const label = (status) => ({ status, label: status });

function callKey(item) {
  return `${item.response_id ?? ""} ${item.call_id}`;
}

// What became of a call, from its output: the runner's refusals and tool errors are
// `{"error": …}` outputs (approvals.md words the refusals), anything else is a result.
export function outcome(output) {
  let error = null;
  try {
    const parsed = JSON.parse(output);
    if (parsed && typeof parsed === "object" && typeof parsed.error === "string") error = parsed.error;
  } catch {
    // not JSON: a plain result
  }
  if (error === null) return label("completed");
  if (error.startsWith("declined by ")) return label("declined");
  if (error.startsWith("denied by policy ")) return label("denied");
  if (error === "not approved") return { status: "not-approved", label: "not approved" };
  return label("failed");
}

// The snapshot's nested item ({…header, data}) in the flat shape of the stream.
export function flatten(item) {
  return { ...item.data, ...item, data: undefined };
}

// An MCP tool's images (the output item's `images`, docs/agents.md): thumbnails under
// its output. Only image data URIs of the types the runner passes are drawn.
const IMAGE_URI = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=]+$/;

function drawImages(node, images) {
  const uris = (Array.isArray(images) ? images : [])
    .map((part) => part?.image_url)
    .filter((uri) => typeof uri === "string" && IMAGE_URI.test(uri));
  node.replaceChildren(
    ...uris.map((uri, index) =>
      el("img", { class: "call-image", src: uri, alt: `image ${index + 1} of the tool's output` }),
    ),
  );
  node.hidden = uris.length === 0;
}
