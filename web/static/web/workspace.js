// The workspace (files.md, section 2): a tree of the runner's workspace folder, a file
// opened read-only (read users) or editable with Save (edit users), download, search.
// Names and contents go in as text; a download is always an attachment.
import { api, get } from "./api.js";
import { el, showError } from "./util.js";

const encodePath = (path) => path.split("/").map(encodeURIComponent).join("/");

export class WorkspacePanel {
  constructor(sessionId) {
    this.base = `/v1/sessions/${encodeURIComponent(sessionId)}/resources/environments/default`;
    this.$ = (id) => document.getElementById(id);
    this.canEdit = false;
    this.bound = false;
    this.openPath = null;
    this.$("ws-search").addEventListener("submit", (event) => {
      event.preventDefault();
      this.search(this.$("ws-query").value);
    });
    this.$("ws-save").addEventListener("click", () => this.save());
    this.$("ws-close").addEventListener("click", () => {
      this.$("ws-file").hidden = true;
      this.openPath = null;
    });
  }

  // With no runner bound there is no workspace to ask for (the API answers 409): the
  // panel says so, and is read once a runner is bound (`bound` again).
  async show({ canEdit, bound, canBind }) {
    this.canEdit = canEdit;
    this.canBind = canBind;
    this.$("panel-workspace").hidden = false;
    await this.setBound(bound);
  }

  async setBound(bound) {
    this.bound = bound;
    this.$("ws-search").hidden = !bound;
    if (!bound) {
      this.$("ws-tree").replaceChildren();
      this.$("ws-hits").hidden = true;
      this.$("ws-file").hidden = true;
      this.openPath = null;
      this.note({
        message: this.canBind
          ? "Bind a runner (above) to see its workspace."
          : "No runner is bound: the workspace shows once the owner binds one.",
      });
      return;
    }
    await this.expand("", this.$("ws-tree"));
  }

  // The agent changed files: the top level is read again (open folders close).
  refresh() {
    if (this.$("panel-workspace").hidden || !this.bound || this.refreshing) return;
    this.refreshing = setTimeout(() => {
      this.refreshing = null;
      this.expand("", this.$("ws-tree"));
    }, 300);
  }

  note(error) {
    const node = this.$("ws-note");
    node.textContent = error ? error.message : "";
    node.hidden = !error;
  }

  // The tree could not be read (runner offline, server away): read it again once the
  // cause is gone (the session page calls this when the runner or the server is back).
  retry() {
    if (this.$("panel-workspace").hidden || !this.bound || !this.failed) return;
    this.expand("", this.$("ws-tree"));
  }

  async expand(path, container) {
    this.note(null);
    let listing;
    try {
      listing = await get(`${this.base}/filesystem${path ? "/" + encodePath(path) : ""}`);
    } catch (error) {
      if (!path) this.failed = true;
      this.note(error);
      return;
    }
    if (!path) this.failed = false;
    if (!listing.data.length) {
      container.replaceChildren(el("li", { class: "muted", text: "Empty folder." }));
      return;
    }
    container.replaceChildren(
      ...listing.data.map((entry) => {
        const child = el("ul", { class: "tree", hidden: true });
        const isDir = entry.type === "directory";
        const button = el("button", {
          type: "button",
          class: `entry-button ${isDir ? "dir" : "file"}`,
          "aria-expanded": isDir ? "false" : null,
          text: isDir ? `${entry.name}/` : entry.name,
          onclick: async () => {
            if (!isDir) {
              await this.open(entry.path);
              return;
            }
            const opening = child.hidden;
            child.hidden = !opening;
            button.setAttribute("aria-expanded", opening ? "true" : "false");
            if (opening) await this.expand(entry.path, child);
          },
        });
        return el("li", { dataset: { path: entry.path } }, button, child);
      }),
    );
  }

  async open(path) {
    this.note(null);
    let file;
    try {
      file = await get(`${this.base}/filesystem/${encodePath(path)}`);
    } catch (error) {
      this.note(error);
      return;
    }
    this.openPath = path;
    this.$("ws-path").textContent = path;
    this.$("ws-download").href = `${this.base}/filesystem/${encodePath(path)}?download=1`;
    const text = file.encoding === "utf-8" ? file.content : "(binary file: download it)";
    const area = this.$("ws-content");
    area.value = text;
    const editable = this.canEdit && file.encoding === "utf-8" && !file.truncated;
    area.readOnly = !editable;
    this.$("ws-save").hidden = !editable;
    this.$("ws-file").hidden = false;
  }

  async save() {
    if (!this.openPath) return;
    this.note(null);
    try {
      await api("PUT", `${this.base}/filesystem/${encodePath(this.openPath)}`, {
        content: this.$("ws-content").value,
      });
      this.$("ws-save").textContent = "Saved";
      setTimeout(() => (this.$("ws-save").textContent = "Save"), 1500);
    } catch (error) {
      this.note(error);
    }
  }

  async search(query) {
    const hits = this.$("ws-hits");
    if (!query.trim()) {
      hits.hidden = true;
      return;
    }
    this.note(null);
    try {
      const found = await get(`${this.base}/search?q=${encodeURIComponent(query)}&limit=100`);
      hits.replaceChildren(
        ...found.data.map((hit) =>
          el(
            "li",
            {},
            el("button", {
              type: "button",
              class: "entry-button file",
              text: `${hit.path}:${hit.line}  ${hit.text}`,
              onclick: () => this.open(hit.path),
            }),
          ),
        ),
      );
      if (!found.data.length) hits.replaceChildren(el("li", { class: "muted", text: "No matches." }));
      hits.hidden = false;
    } catch (error) {
      showError(this.$("ws-note"), error);
    }
  }
}
