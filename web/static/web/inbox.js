// The inbox (web.md, Inbox): what waits for the user across sessions (open questions
// they may answer, failed sessions) from GET /v1/inbox. Every signed-in page loads this
// module: the header's "Inbox" link carries the count, read on load, every 15 s, and
// when the tab is shown again. Browser notifications are opt-in (the Inbox page's
// "Notify me"): when something new waits while the tab is hidden, one notification.
import { get } from "./api.js";

const POLL_MS = 15000;
const OPTED_IN = "omnigent-notify";
const countNode = document.getElementById("inbox-count");
let seen = null; // keys of what the last read held (null: not read yet)
const listeners = new Set();

export function onInbox(listener) {
  listeners.add(listener);
}

function keyOf(kind, row) {
  return kind === "approval" ? `a:${row.elicitation_id}` : `f:${row.session_id}:${row.updated_at}`;
}

export async function refreshInbox() {
  const inbox = await get("/v1/inbox");
  if (countNode) {
    countNode.textContent = String(inbox.count);
    countNode.hidden = inbox.count === 0;
    countNode.parentElement?.setAttribute(
      "aria-label",
      inbox.count ? `Inbox, ${inbox.count} waiting for you` : "Inbox",
    );
  }
  const now = new Set();
  const fresh = [];
  for (const row of inbox.approvals) {
    const key = keyOf("approval", row);
    now.add(key);
    if (seen && !seen.has(key)) fresh.push({ key, title: "A question is waiting", body: `${row.session_title || "Untitled session"}: ${row.message}`, session: row.session_id });
  }
  for (const row of inbox.failed) {
    const key = keyOf("failed", row);
    now.add(key);
    if (seen && !seen.has(key)) fresh.push({ key, title: "A turn failed", body: `${row.session_title || "Untitled session"}: ${row.error?.message ?? "failed"}`, session: row.session_id });
  }
  seen = now;
  for (const item of fresh) notify(item);
  for (const listener of listeners) listener(inbox);
  return inbox;
}

// --- notifications (opt-in) ---------------------------------------------------------

const notified = new Set();

export function notificationsOn() {
  return "Notification" in window && Notification.permission === "granted" && localStorage.getItem(OPTED_IN) === "1";
}

export async function optIn() {
  if (!("Notification" in window)) return "unsupported";
  const answer = Notification.permission === "granted" ? "granted" : await Notification.requestPermission();
  if (answer === "granted") localStorage.setItem(OPTED_IN, "1");
  return answer;
}

export function optOut() {
  localStorage.removeItem(OPTED_IN);
}

// One notification per thing waiting, only while the tab is hidden (a visible page
// shows it already); a click opens its session.
export function notify({ key, title, body, session }) {
  if (!document.hidden || !notificationsOn() || notified.has(key)) return;
  notified.add(key);
  const note = new Notification(title, { body, tag: key });
  note.onclick = () => {
    window.focus();
    if (session) window.location.assign(`/s/${encodeURIComponent(session)}`);
  };
}

function poll() {
  refreshInbox().catch(() => {});
}

if (document.body.dataset.page && document.body.dataset.page !== "signin") {
  poll();
  setInterval(poll, POLL_MS);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) poll();
  });
}
