// Approval cards (approvals.md): a question from the agent with the tool, its arguments
// and the policy; Approve / Decline with an optional reason. A card closes in every open
// tab when anyone answers (`response.elicitation_resolved`); questions raised before the
// page was opened come from the snapshot's `pending_elicitations`.
import { api } from "./api.js";
import { el, showError } from "./util.js";

export class ApprovalCards {
  constructor(sessionId, root) {
    this.base = `/v1/sessions/${encodeURIComponent(sessionId)}/elicitations`;
    this.root = root;
    this.cards = new Map(); // elicitation id -> <li>
    this.canAnswer = false;
  }

  reset(pending, canAnswer) {
    this.canAnswer = canAnswer;
    this.cards.clear();
    this.root.replaceChildren();
    for (const request of pending ?? []) this.requested(request);
  }

  requested(request) {
    const id = request.elicitation_id;
    if (this.cards.has(id)) return;
    const params = request.params ?? {};
    const reason = el("input", { id: `reason-${id}`, maxlength: 500, placeholder: "optional" });
    const error = el("p", { class: "error", role: "alert", hidden: true });
    const buttons = this.canAnswer
      ? el(
          "div",
          { class: "inline" },
          el("label", { for: `reason-${id}`, text: "Reason" }),
          reason,
          el("button", {
            type: "button",
            class: "primary approve",
            text: "Approve",
            onclick: () => this.answer(id, "accept", reason.value, error),
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
      { class: "approval", dataset: { id }, role: "group", "aria-label": "Approval needed" },
      el("p", { class: "approval-message", text: params.message ?? "The agent asks to run a tool." }),
      params.policy_name ? el("p", { class: "muted", text: `Policy: ${params.policy_name}` }) : null,
      el("pre", { class: "call-args", text: params.content_preview ?? "" }),
      buttons,
      error,
    );
    this.cards.set(id, card);
    this.root.append(card);
  }

  resolved(event) {
    const card = this.cards.get(event.elicitation_id);
    if (!card) return;
    this.cards.delete(event.elicitation_id);
    card.remove();
  }

  async answer(id, action, reason, errorNode) {
    showError(errorNode, null);
    const body = { action };
    if (reason.trim()) body.reason = reason.trim();
    try {
      await api("POST", `${this.base}/${encodeURIComponent(id)}/resolve`, body);
      this.resolved({ elicitation_id: id });
    } catch (error) {
      showError(errorNode, error);
    }
  }
}
