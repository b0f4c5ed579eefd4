// The one place the pages call fetch(): the chat page's modules and the dashboard (admin.js)
// import it. Requests are same-origin; every request but a GET carries the CSRF token (the
// page's <meta name="csrf-token">, replaced once /api/session or a sign-in hands out a new one);
// a refusal throws an ApiError with the server's JSON "error" (else "Request failed (status)").

let csrfToken = document.querySelector('meta[name="csrf-token"]')?.content || null;

export function setCsrfToken(token) {
  csrfToken = token;
}

export class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

async function request(method, url, body, accept, signal) {
  const opts = { method, headers: { "Accept": accept }, credentials: "same-origin", signal };
  if (method !== "GET") opts.headers["X-CSRFToken"] = csrfToken;
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(url, opts);
  if (!resp.ok) {
    let data = null;
    try { data = await resp.json(); } catch (e) { /* not JSON */ }
    throw new ApiError((data && data.error) || `Request failed (${resp.status})`, resp.status);
  }
  return resp;
}

// A JSON request; resolves to the answer's JSON (null for an empty body).
export async function api(method, url, body) {
  const resp = await request(method, url, body, "application/json");
  try { return await resp.json(); } catch (e) { return null; }  // empty body
}

// A POST whose answer is a text/event-stream: resolves to the Response once the server accepts it,
// for the caller to read (signal: an AbortController's, to stop reading).
export function openStream(url, body, signal) {
  return request("POST", url, body, "text/event-stream", signal);
}
