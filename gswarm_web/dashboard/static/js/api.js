// The REST API as the pages see it: the bearer token from sessionStorage, the one error shape, pages of lists.
// Every request the dashboard makes goes through here, to this host's /api/v1, like any other client's.

const KEY = "gswarm.token";
export const BASE = "/api/v1";

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

/** An API refusal: status, code, message and details as `{"error": {...}}` carries them. */
export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || `HTTP_${status}`;
    this.details = e.details || {};
  }
  /** [{field, message}] from `details.errors`, or the one `details.field`. */
  fieldErrors() {
    if (Array.isArray(this.details.errors)) return this.details.errors;
    if (this.details.field) return [{ field: this.details.field, message: this.message }];
    return [];
  }
}

export async function api(method, path, { json, body, headers = {}, raw = false, signal } = {}) {
  const h = { Accept: "application/json", ...headers };
  const t = token.get();
  if (t) h.Authorization = `Bearer ${t}`;
  if (json !== undefined) {
    h["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  const r = await fetch(BASE + path, { method, headers: h, body, signal, cache: "no-store" });
  if (!r.ok) {
    let b = null;
    try { b = await r.json(); } catch { /* not JSON: the status says enough */ }
    const err = new ApiError(r.status, b);
    if (r.status === 401) window.dispatchEvent(new CustomEvent("gswarm:unauthorized", { detail: err }));
    throw err;
  }
  if (raw) return r;
  if (r.status === 204) return null;
  return r.json();
}

export const get = (path, opts) => api("GET", path, opts);
export const post = (path, json, opts = {}) => api("POST", path, { ...opts, json });
export const patch = (path, json, opts = {}) => api("PATCH", path, { ...opts, json });
export const del = (path, opts) => api("DELETE", path, opts);

/** Every item of a paged list (`{key: [...], total, page, per_page}`), 500 a request. */
export async function all(path, key, opts) {
  const sep = path.includes("?") ? "&" : "?";
  const out = [];
  for (let page = 1; ; page++) {
    const body = await get(`${path}${sep}per_page=500&page=${page}`, opts);
    out.push(...body[key]);
    if (out.length >= body.total || body[key].length === 0) return out;
  }
}

/** Fetch a file the API answers (export, plot) with the token, and hand it to the browser as a download. */
export async function download(path, filename) {
  const r = await api("GET", path, { raw: true, headers: { Accept: "*/*" } });
  const url = URL.createObjectURL(await r.blob());
  const a = Object.assign(document.createElement("a"), { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}
