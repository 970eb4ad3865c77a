// Small DOM helpers. Text is always inserted as text (textContent), never as HTML.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function relativeTime(seconds, now = Date.now() / 1000) {
  const delta = Math.max(0, Math.round(now - seconds));
  if (delta < 45) return "just now";
  if (delta < 90) return "1 min ago";
  if (delta < 3600) return `${Math.round(delta / 60)} min ago`;
  if (delta < 5400) return "1 h ago";
  if (delta < 86400) return `${Math.round(delta / 3600)} h ago`;
  if (delta < 2 * 86400) return "yesterday";
  return `${Math.round(delta / 86400)} days ago`;
}

export function isoTime(seconds) {
  return new Date(seconds * 1000).toISOString();
}

// The API's error code goes along (`data-code`), so a page can clear an error once its
// cause is gone.
export function showError(node, error) {
  if (!node) return;
  if (!error) {
    node.hidden = true;
    node.textContent = "";
    delete node.dataset.code;
    delete node.dataset.status;
    return;
  }
  node.textContent = error.message ?? String(error);
  node.dataset.code = error.code ?? "";
  node.dataset.status = String(error.status ?? "");
  node.hidden = false;
}

// An error the runner's absence caused (a 503 or 504 from the API, a tunnel error, the
// server out of reach): cleared once the cause is gone.
export function isTransient(node) {
  if (node.hidden) return false;
  const code = node.dataset.code ?? "";
  const status = Number(node.dataset.status || 0);
  return code === "network" || code.startsWith("runner") || code.startsWith("tunnel") || status === 503 || status === 504;
}

export const STATUS_LABELS = {
  running: "running",
  waiting: "waiting",
  idle: "idle",
  failed: "failed",
};

// Usage (docs/usage.md): a cost in USD ("—" when unpriced: never shown as 0), a token
// count, and a turn's line "1,234 tokens · $0.0021".
export function formatUsd(value) {
  if (value === null || value === undefined) return "—";
  if (value === 0) return "$0";
  if (value < 1) return `$${value.toFixed(4)}`;
  return `$${value.toFixed(2)}`;
}

export function formatTokens(count) {
  return `${Number(count ?? 0).toLocaleString("en-US")} tokens`;
}

export function usageLine(usage) {
  if (!usage) return null;
  const calls = `${usage.llm_calls} model call${usage.llm_calls === 1 ? "" : "s"}`;
  if (usage.total_tokens === undefined) return `${calls} · usage not reported`;
  return `${formatTokens(usage.total_tokens)} · ${formatUsd(usage.cost_usd)} · ${calls}`;
}
