// The public HTTP API, as the page uses it: JSON in and out, the CSRF token on every
// state change, errors as ApiError with the API's code and message.

const csrfToken = document.querySelector('meta[name="csrf-token"]')?.content ?? "";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export async function api(method, path, body, { form } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken;
  let payload;
  if (form) {
    payload = form;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, { method, headers, body: payload, credentials: "same-origin" });
  } catch {
    // The browser's own words ("Failed to fetch") say nothing; the code lets the page
    // clear this error once the server answers again.
    throw new ApiError(0, "network", "Cannot reach the server. Check your connection and try again.");
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = data?.error ?? {};
    throw new ApiError(
      response.status,
      error.code ?? "http_" + response.status,
      error.message ?? `request failed (${response.status})`,
    );
  }
  return data;
}

export const get = (path) => api("GET", path);

export function bootData() {
  const node = document.getElementById("boot");
  return node ? JSON.parse(node.textContent) : {};
}
