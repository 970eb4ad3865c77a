// The Share dialog (managers): list grants, grant by user id and level, revoke.
import { api, get } from "./api.js";
import { el, showError } from "./util.js";

const LEVELS = { 1: "read", 2: "edit", 3: "manage", 4: "owner" };

export class ShareDialog {
  constructor(sessionId) {
    this.path = `/v1/sessions/${encodeURIComponent(sessionId)}/permissions`;
    this.dialog = document.getElementById("share-dialog");
    this.rows = document.getElementById("grants");
    this.error = document.getElementById("share-error");
    document.getElementById("grant-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.grant();
    });
  }

  async open() {
    showError(this.error, null);
    this.dialog.showModal();
    await this.load();
  }

  async load() {
    const grants = [];
    let cursor = null;
    do {
      const query = cursor ? `?limit=100&after=${encodeURIComponent(cursor)}` : "?limit=100";
      const page = await get(this.path + query);
      grants.push(...page.permissions);
      cursor = page.next_cursor;
    } while (cursor);
    this.rows.replaceChildren(
      ...grants.map((grant) =>
        el(
          "tr",
          { dataset: { user: grant.user_id } },
          el("td", { text: grant.user_id }),
          el("td", { text: LEVELS[grant.level] ?? grant.level }),
          el(
            "td",
            {},
            grant.level < 4
              ? el("button", {
                  type: "button",
                  class: "danger",
                  text: "Revoke",
                  "aria-label": `Revoke ${grant.user_id}`,
                  onclick: () => this.revoke(grant.user_id),
                })
              : null,
          ),
        ),
      ),
    );
  }

  async grant() {
    showError(this.error, null);
    const user = document.getElementById("grant-user");
    const level = Number(document.getElementById("grant-level").value);
    try {
      await api("PUT", this.path, { user_id: user.value.trim(), level });
      user.value = "";
      await this.load();
    } catch (error) {
      showError(this.error, error);
    }
  }

  async revoke(userId) {
    showError(this.error, null);
    try {
      await api("DELETE", `${this.path}/${encodeURIComponent(userId)}`);
      await this.load();
    } catch (error) {
      showError(this.error, error);
    }
  }
}
