// Changed files (web.md, Session): the change set with status and +/− counts; a click
// shows the diff. File names go in as text.
import { get } from "./api.js";
import { renderDiff } from "./diff.js";
import { el } from "./util.js";

export class ChangesPanel {
  constructor(sessionId) {
    this.base = `/v1/sessions/${encodeURIComponent(sessionId)}/resources/environments/default`;
    this.list = document.getElementById("changes");
    this.empty = document.getElementById("changes-empty");
    this.diffPanel = document.getElementById("panel-diff");
    this.diffTitle = document.getElementById("diff-title");
    this.diffBody = document.getElementById("diff");
    this.loading = null;
    this.again = false;
  }

  // Coalesces bursts of invalidations into one request at a time.
  async reload() {
    if (this.loading) {
      this.again = true;
      return this.loading;
    }
    this.loading = (async () => {
      try {
        do {
          this.again = false;
          const page = await get(`${this.base}/changes`);
          this.render(page.data);
        } while (this.again);
      } finally {
        this.loading = null;
      }
    })();
    return this.loading;
  }

  render(all) {
    const entries = all.filter((entry) => !unchanged(entry));
    this.empty.hidden = entries.length > 0;
    this.list.replaceChildren(
      ...entries.map((entry) =>
        el(
          "li",
          { dataset: { path: entry.path, status: entry.status } },
          el(
            "button",
            { type: "button", class: "change", onclick: () => this.open(entry.path) },
            el("span", { class: "change-status", dataset: { status: entry.status }, text: entry.status[0].toUpperCase(), title: entry.status }),
            el("span", { class: "change-path", text: entry.path }),
            el("span", { class: "plus", text: entry.lines_added === null ? "" : `+${entry.lines_added}` }),
            el("span", { class: "minus", text: entry.lines_removed === null ? "" : `−${entry.lines_removed}` }),
          ),
        ),
      ),
    );
  }

  async open(path) {
    const encoded = path.split("/").map(encodeURIComponent).join("/");
    this.diffTitle.textContent = path;
    this.diffBody.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
    this.diffPanel.hidden = false;
    try {
      const diff = await get(`${this.base}/diff/${encoded}`);
      this.diffBody.replaceChildren(renderDiff(diff.before, diff.after));
    } catch (error) {
      this.diffBody.replaceChildren(el("p", { class: "error", text: error.message }));
    }
    this.diffPanel.scrollIntoView({ block: "nearest" });
  }
}

// A file rewritten with the content it had is `modified` with 0 lines added and removed
// in the server's record (agents.md: modified, then modified); there is nothing to show.
function unchanged(entry) {
  return entry.status === "modified" && entry.lines_added === 0 && entry.lines_removed === 0;
}
