// Small DOM helpers: h() and s() build elements, a few formatters, tables, badges, bars and error boxes.

import { ApiError } from "./api.js";

export const session = { me: null }; // {name, role, can_write}, from GET /tokens/self

export const canWrite = () => Boolean(session.me && session.me.can_write);

function build(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style") Object.assign(el.style, v); // CSSOM, allowed by the page's CSP (attributes are not)
    else if (k === "class") el.setAttribute("class", Array.isArray(v) ? v.filter(Boolean).join(" ") : v);
    else if (k in el && !(el instanceof SVGElement) && k !== "list") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const h = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
export const s = (tag, attrs, ...children) =>
  build(document.createElementNS("http://www.w3.org/2000/svg", tag), attrs, children);

/** A button that writes: absent for a token that may only read (the API would refuse it anyway). */
export function writeButton(label, onclick, attrs = {}) {
  if (!canWrite()) return null;
  return h("button", { ...attrs, "data-write": "", onclick: guard(onclick) }, label);
}

/** A button that only reads (plan, export, plot, simulate): shown to every token. */
export function readButton(label, onclick, attrs = {}) {
  return h("button", { ...attrs, "data-read": "", onclick: guard(onclick) }, label);
}

/** Run an async handler with its button disabled; an error lands in `attrs.errorTarget` or an alert. */
export function guard(fn) {
  return async (ev) => {
    const btn = ev && ev.currentTarget;
    if (btn) btn.disabled = true;
    try { await fn(ev); } catch (err) { showError(err); } finally { if (btn) btn.disabled = false; }
  };
}

let toastEl = null;
export function showError(err) {
  console.error(err);
  if (!toastEl) {
    toastEl = h("div", { class: "errorbox", id: "toast" });
    toastEl.style.position = "fixed";
    toastEl.style.right = "16px";
    toastEl.style.bottom = "16px";
    toastEl.style.maxWidth = "520px";
    document.body.append(toastEl);
  }
  fill(toastEl, errorText(err));
  toastEl.hidden = false;
  clearTimeout(toastEl.timer);
  toastEl.timer = setTimeout(() => { toastEl.hidden = true; }, 8000);
}

export function errorText(err) {
  if (err instanceof ApiError) return `${err.status} ${err.code}: ${err.message}`;
  return String((err && err.message) || err);
}

export const errorBox = (err) => h("div", { class: "errorbox" }, errorText(err));

export function badge(status, extra = "") {
  return h("span", { class: `badge s-${status} ${extra}`, "data-status": status }, status ?? "—");
}

export function bar(fraction, cls = "") {
  const span = h("span");
  span.style.width = `${Math.max(0, Math.min(1, fraction || 0)) * 100}%`;
  return h("div", { class: `bar ${cls}` }, span);
}

export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  let v = Number(n);
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(v >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

export const fmtPct = (v) => (v === null || v === undefined ? "—" : `${Number(v).toFixed(0)}%`);

export function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 60) return `${seconds.toFixed(1)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { hour12: false });
}

export function fmtDuration(a, b) {
  if (!a) return "—";
  const ms = (b ? new Date(b) : new Date()) - new Date(a);
  return ms < 1000 ? `${ms} ms` : ms < 120_000 ? `${(ms / 1000).toFixed(1)} s` : `${(ms / 60000).toFixed(1)} min`;
}

/** A table from column specs `[{label, get(row) -> node|text, cls}]`; `rowAttrs(row)` adds attributes to a row. */
export function table(columns, rows, { rowAttrs, empty = "nothing yet" } = {}) {
  const head = h("tr", null, columns.map((c) => h("th", { class: c.cls }, c.label)));
  const body = rows.length
    ? rows.map((r) => h("tr", rowAttrs ? rowAttrs(r) : null, columns.map((c) => h("td", { class: c.cls }, c.get(r)))))
    : [h("tr", null, h("td", { colSpan: columns.length, class: "muted" }, empty))];
  return h("table", null, h("thead", null, head), h("tbody", null, body));
}

export const json = (v) => (v === null || v === undefined ? "" : h("pre", { class: "json" }, JSON.stringify(v, null, 1)));

/** A polling loop that stops when `signal` aborts; errors are shown in `onError`, polling goes on. */
export function poll(fn, ms, signal, onError = showError) {
  let timer = null;
  const tick = async () => {
    if (signal.aborted) return;
    const t0 = performance.now();
    try { await fn(); } catch (err) { if (!signal.aborted) onError(err); }
    if (!signal.aborted) timer = setTimeout(tick, Math.max(0, ms - (performance.now() - t0)));
  };
  signal.addEventListener("abort", () => clearTimeout(timer));
  tick();
}

/** Distinct colours for models, steps or series, stable per name. */
export function colorOf(name) {
  let x = 0;
  for (const ch of String(name)) x = (x * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${x % 360} 60% 48%)`;
}

/** Replace an element's children, skipping null/undefined/false (which the DOM's own replaceChildren would print). */
export function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

/** Append children, skipping null/undefined/false and flattening arrays (the DOM's append would print them). */
export function add(el, ...children) {
  el.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}
