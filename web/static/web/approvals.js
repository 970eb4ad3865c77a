// Approval cards (approvals.md): a question from the agent with the tool, its arguments
// and the policy; Approve / Decline with an optional reason. A card closes in every open
// tab when anyone answers (`response.elicitation_resolved`); questions raised before the
// page was opened come from the snapshot's `pending_elicitations`. A question is easy to
// miss at the foot of a long conversation: a new card is scrolled into view (clear of the
// sticky composer), the number waiting goes to the tab title (`onCount`), and after an
// answer focus moves to the next card's button or the composer, never to <body>.
// An MCP server's own question (mcp.md: no policy, a `requestedSchema`) gets a form of its
// schema's fields, sent as the answer's `content`.
import { api } from "./api.js";
import { el, showError } from "./util.js";

export class ApprovalCards {
  constructor(sessionId, root, { composer = null, onCount = () => {}, onVerdict = () => {} } = {}) {
    this.base = `/v1/sessions/${encodeURIComponent(sessionId)}/elicitations`;
    this.root = root;
    this.composer = composer; // the sticky composer a card must not hide behind
    this.onCount = onCount;
    this.onVerdict = onVerdict; // ({response_id, call_id, text}) for the call's card
    this.cards = new Map(); // elicitation id -> <li>
    this.canAnswer = false;
  }

  get count() {
    return this.cards.size;
  }

  reset(pending, canAnswer) {
    this.canAnswer = canAnswer;
    this.cards.clear();
    this.root.replaceChildren();
    for (const request of pending ?? []) this.requested(request, { reveal: false });
    const first = this.root.firstElementChild;
    if (first) this.reveal(first);
    this.onCount(this.count);
  }

  requested(request, { reveal = true } = {}) {
    const id = request.elicitation_id;
    if (this.cards.has(id)) return;
    const params = request.params ?? {};
    // A budget question (docs/usage.md, Budgets): its sentence says it all
    // ("Budget reached: spent $x of $y — allow $z more?"), no call to show.
    const budget = params.phase === "budget";
    const reason = el("input", { id: `reason-${id}`, maxlength: 500, placeholder: "optional" });
    const error = el("p", { class: "error", role: "alert", hidden: true });
    const form = this.canAnswer ? schemaForm(id, params.requestedSchema) : null;
    const buttons = this.canAnswer
      ? el(
          "div",
          { class: "inline" },
          el("label", { for: `reason-${id}`, text: "Reason" }),
          reason,
          el("button", {
            type: "button",
            class: "primary approve",
            text: budget ? "Allow more" : "Approve",
            onclick: () => this.answer(id, "accept", reason.value, error, form?.content()),
          }),
          el("button", {
            type: "button",
            class: "danger decline",
            text: "Decline",
            onclick: () => this.answer(id, "decline", reason.value, error),
          }),
        )
      : el("p", { class: "muted", text: "Waiting for someone with edit access to answer." });
    const card = el(
      "li",
      {
        class: budget ? "approval budget" : "approval",
        dataset: { id },
        role: "group",
        "aria-label": budget ? "Budget reached" : "Approval needed",
      },
      el("p", { class: "approval-message", text: params.message ?? "The agent asks to run a tool." }),
      params.policy_name && !budget
        ? el("p", { class: "muted", text: `Policy: ${params.policy_name}` })
        : null,
      budget
        ? el("p", {
            class: "muted",
            text:
              params.scope === "user"
                ? "The owner's daily budget is spent; only staff may raise it."
                : "The session's budget is spent; the next model call waits.",
          })
        : form
          ? el("p", { class: "muted", text: "Asked by an MCP server during a tool call." })
          : el("pre", { class: "call-args", text: params.content_preview ?? "" }),
      form?.node,
      buttons,
      error,
    );
    this.cards.set(id, card);
    this.root.append(card);
    if (reveal) {
      this.onCount(this.count);
      // Only the first waiting question is brought into view: later ones queue below it.
      if (this.count === 1) this.reveal(card);
    }
  }

  resolved(event) {
    const card = this.cards.get(event.elicitation_id);
    if (!card) return;
    const hadFocus = card.contains(document.activeElement);
    this.cards.delete(event.elicitation_id);
    card.remove();
    this.onCount(this.count);
    if (hadFocus) this.focusNext();
  }

  // Who answered is read from the approvals listing: the resolved event names who and what,
  // but not the call; after a reload only the listing has it.
  async loadVerdicts() {
    let after = null;
    for (;;) {
      const query = `?status=resolved&limit=1000${after ? `&after=${encodeURIComponent(after)}` : ""}`;
      const page = await api("GET", `${this.base}${query}`);
      for (const row of page.data) this.verdict(row);
      if (!page.has_more || !page.last_id) return;
      after = page.last_id;
    }
  }

  async fetchVerdict(id) {
    this.verdict(await api("GET", `${this.base}/${encodeURIComponent(id)}`));
  }

  verdict(row) {
    if (!row.resolved_by) return; // expired: the call's own status says "not approved"
    let text;
    if (row.status === "accepted") text = `approved by ${row.resolved_by}`;
    else if (row.status === "declined") {
      text = `declined by ${row.resolved_by}${row.reason ? `: ${row.reason}` : ""}`;
    } else return;
    this.onVerdict({ response_id: row.response_id, call_id: row.call_id, text });
  }

  // The composer is sticky at the foot of the page: a card (or a button reached with Tab)
  // keeps that much room below it when scrolled to.
  margin() {
    return `${(this.composer?.offsetHeight ?? 0) + 16}px`;
  }

  reveal(card) {
    card.style.scrollMarginBottom = this.margin();
    for (const node of card.querySelectorAll("button, input")) {
      node.style.scrollMarginBottom = this.margin();
    }
    const box = card.getBoundingClientRect();
    const bottom = window.innerHeight - (this.composer?.offsetHeight ?? 0);
    if (box.top < 0 || box.bottom > bottom) card.scrollIntoView({ block: "end" });
  }

  focusNext() {
    const next = this.root.querySelector("li.approval button.approve");
    const target = next ?? document.getElementById("message");
    if (!target) return;
    target.focus({ preventScroll: true });
    target.scrollIntoView({ block: "center" });
  }

  async answer(id, action, reason, errorNode, content) {
    showError(errorNode, null);
    const body = { action };
    if (reason.trim()) body.reason = reason.trim();
    if (content) body.content = content;
    try {
      await api("POST", `${this.base}/${encodeURIComponent(id)}/resolve`, body);
      this.resolved({ elicitation_id: id });
    } catch (error) {
      showError(errorNode, error);
    }
  }
}

// The fields of an MCP server's `requestedSchema` (form mode: a flat object of strings,
// numbers, booleans and enums) as inputs; null for a rule's question (schema `{}`).
function schemaForm(id, schema) {
  const properties = schema?.properties;
  if (!properties || typeof properties !== "object" || !Object.keys(properties).length) return null;
  const required = new Set(schema.required ?? []);
  const readers = [];
  const rows = Object.entries(properties).map(([name, spec], index) => {
    const inputId = `field-${id}-${index}`;
    const title = `${spec.title ?? name}${required.has(name) ? " *" : ""}`;
    let input;
    if (spec.type === "boolean") {
      input = el("input", { id: inputId, type: "checkbox", checked: spec.default === true });
      readers.push(() => [name, input.checked]);
    } else if (Array.isArray(spec.enum)) {
      input = el("select", { id: inputId }, spec.enum.map((value) => el("option", { value, text: String(value) })));
      readers.push(() => [name, input.value]);
    } else {
      const numeric = spec.type === "number" || spec.type === "integer";
      input = el("input", { id: inputId, type: numeric ? "number" : "text", value: spec.default ?? "" });
      readers.push(() => {
        if (input.value === "" && !required.has(name)) return null;
        return [name, numeric ? Number(input.value) : input.value];
      });
    }
    return el(
      "div",
      { class: "inline mcp-field" },
      el("label", { for: inputId, text: title }),
      input,
      spec.description ? el("span", { class: "muted", text: spec.description }) : null,
    );
  });
  return {
    node: el("div", { class: "mcp-form" }, rows),
    content: () => Object.fromEntries(readers.map((read) => read()).filter(Boolean)),
  };
}
