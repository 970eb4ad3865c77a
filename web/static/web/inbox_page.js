// The Inbox page (web.md, Inbox): every open question the user may answer and every
// failed session, each linking to its session; "Notify me" turns on browser
// notifications for what arrives while the tab is hidden.
import { notificationsOn, onInbox, optIn, optOut } from "./inbox.js";
import { el, isoTime, relativeTime } from "./util.js";

const list = document.getElementById("inbox-list");
const empty = document.getElementById("inbox-empty");
const toggle = document.getElementById("notify");
const note = document.getElementById("notify-note");

function link(row) {
  return el("a", { href: `/s/${encodeURIComponent(row.session_id)}`, text: row.session_title || "Untitled session" });
}

function draw(inbox) {
  const rows = [
    ...inbox.approvals.map((row) =>
      el(
        "li",
        { class: "inbox-row", dataset: { kind: "approval", session: row.session_id } },
        el("span", { class: "badge pending", text: "question" }),
        link(row),
        el("span", { class: "inbox-text", text: `${row.tool}: ${row.message}` }),
        el("time", { datetime: isoTime(row.created_at), text: relativeTime(row.created_at) }),
      ),
    ),
    ...inbox.failed.map((row) =>
      el(
        "li",
        { class: "inbox-row", dataset: { kind: "failed", session: row.session_id } },
        el("span", { class: "badge", dataset: { status: "failed" }, text: "failed" }),
        link(row),
        el("span", { class: "inbox-text", text: row.error?.message ?? "The last turn failed." }),
        el("time", { datetime: isoTime(row.updated_at), text: relativeTime(row.updated_at) }),
      ),
    ),
  ];
  list.replaceChildren(...rows);
  empty.hidden = rows.length > 0;
}

function drawToggle() {
  const on = notificationsOn();
  toggle.textContent = on ? "Stop notifications" : "Notify me";
  toggle.setAttribute("aria-pressed", on ? "true" : "false");
}

toggle.addEventListener("click", async () => {
  if (notificationsOn()) {
    optOut();
    note.textContent = "";
  } else {
    const answer = await optIn();
    note.textContent =
      answer === "granted"
        ? "You will be notified when something waits while this tab is hidden."
        : answer === "unsupported"
          ? "This browser has no notifications."
          : "Notifications are blocked for this site in the browser's settings.";
  }
  drawToggle();
});

onInbox(draw); // inbox.js (imported first) has just started its first read
drawToggle();
