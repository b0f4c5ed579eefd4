// JSON requests to the chat API, with the CSRF token; errors carry the server's message.

import { state } from "./state.js";

export class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

export async function api(method, url, body) {
  const opts = { method, headers: { "Accept": "application/json" }, credentials: "same-origin" };
  if (method !== "GET") opts.headers["X-CSRFToken"] = state.csrf;
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(url, opts);
  let data = null;
  try { data = await resp.json(); } catch (e) { /* empty body */ }
  if (!resp.ok) throw new ApiError((data && data.error) || `Request failed (${resp.status})`, resp.status);
  return data;
}
