// The ⋯ menu of a session row (web.md, Sidebar), shared by the sidebar and the sessions
// list: pin or unpin (the caller's own list, any grant), archive or unarchive (edit or
// more), delete (the owner, after a confirmation). Each action is one API call; the
// lists follow through GET /v1/sessions/updates, and `onChange` gets the new row at once.
import { api } from "./api.js";
import { el } from "./util.js";

const EDIT = 2;
const OWNER = 4;
let openMenu = null; // { button, menu } of the menu shown, at most one on the page

function close({ focus = false } = {}) {
  if (!openMenu) return;
  const { button, menu } = openMenu;
  openMenu = null;
  menu.hidden = true;
  button.setAttribute("aria-expanded", "false");
  if (focus) button.focus();
}

document.addEventListener("click", (event) => {
  if (openMenu && !openMenu.menu.parentElement.contains(event.target)) close();
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && openMenu) close({ focus: true });
});

const sessionPath = (row) => `/v1/sessions/${encodeURIComponent(row.id)}`;

// Pinned first, then newest activity (the sidebar's order; a stable sort keeps the given
// order among equal times).
export function pinnedFirst(a, b) {
  return Number(b.pinned) - Number(a.pinned) || b.updated_at - a.updated_at;
}

// A confirmation in a native <dialog>: resolves true on Delete, false on Cancel/Escape.
function confirmDelete(row) {
  let dialog = document.getElementById("delete-dialog");
  if (!dialog) {
    dialog = el(
      "dialog",
      { id: "delete-dialog", "aria-labelledby": "delete-title" },
      el("h2", { id: "delete-title", text: "Delete this session?" }),
      el("p", { id: "delete-what" }),
      el(
        "form",
        { method: "dialog", class: "inline" },
        el("button", { type: "submit", value: "cancel", id: "delete-cancel", text: "Cancel" }),
        el("button", { type: "submit", value: "delete", class: "danger", id: "delete-confirm", text: "Delete" }),
      ),
    );
    document.body.append(dialog);
  }
  dialog.querySelector("#delete-what").textContent =
    `“${row.title || "Untitled session"}”, its conversation and its files are deleted ` +
    "for everyone it is shared with. This cannot be undone.";
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "delete"), { once: true });
    dialog.showModal();
    dialog.querySelector("#delete-cancel").focus();
  });
}

// `onChange(row)`: the row after a pin or archive change; `onDeleted(id)`; `onError(error)`.
export function rowMenu(row, { onChange, onDeleted, onError }) {
  const title = row.title || "Untitled session";
  const button = el("button", {
    type: "button",
    class: "menu-button",
    "aria-haspopup": "true",
    "aria-expanded": "false",
    "aria-label": `Actions for ${title}`,
    title: "Actions",
    text: "⋯",
  });
  const act = (label, name, run) =>
    el("button", {
      type: "button",
      class: "menu-item",
      dataset: { action: name },
      text: label,
      onclick: async () => {
        close({ focus: true });
        try {
          await run();
        } catch (error) {
          onError?.(error);
        }
      },
    });
  const items = [
    act(row.pinned ? "Unpin" : "Pin", row.pinned ? "unpin" : "pin", async () => {
      const answer = await api(row.pinned ? "DELETE" : "PUT", `${sessionPath(row)}/pin`);
      onChange?.({ ...row, pinned: answer.pinned });
    }),
  ];
  if (row.permission_level >= EDIT) {
    items.push(
      act(row.archived ? "Unarchive" : "Archive", row.archived ? "unarchive" : "archive", async () => {
        const answer = await api("PATCH", sessionPath(row), { archived: !row.archived });
        onChange?.({ ...row, archived: answer.archived, updated_at: answer.updated_at });
      }),
    );
  }
  if (row.permission_level >= OWNER) {
    items.push(
      act("Delete…", "delete", async () => {
        if (!(await confirmDelete(row))) {
          button.focus();
          return;
        }
        await api("DELETE", sessionPath(row));
        onDeleted?.(row.id);
      }),
    );
  }
  // Buttons in a group, not list items: a row of a list holds no list of its own.
  const menu = el("div", { class: "menu", role: "group", hidden: true, "aria-label": `Actions for ${title}` }, items);
  button.addEventListener("click", (event) => {
    event.stopPropagation();
    const wasOpen = openMenu?.menu === menu;
    close();
    if (wasOpen) return;
    menu.hidden = false;
    button.setAttribute("aria-expanded", "true");
    openMenu = { button, menu };
    menu.querySelector("button")?.focus();
  });
  return el("div", { class: "row-menu" }, button, menu);
}
