// The event stream (/api/v1/events): one WebSocket for the page, signed in by its first message (a browser cannot
// set headers on a WebSocket, and a token in the URL would land in proxies' logs). A page shows changes with live():
// its loader runs at once, again as soon as an event it cares about arrives, and on a slow timer besides; while
// the socket is down it polls at its old pace, and a reconnect (or a resync: something was missed) reloads it.

import { token } from "./api.js";
import { showError } from "./ui.js";

const listeners = new Set();
const SLOW_KEY = "gswarm.slowPollMs"; // sessionStorage: the fallback poll while the socket is up (tests set it long)
const DEBOUNCE_MS = 100; // a burst of events (a batch of steps) is one reload
let socket = null;
let connected = false;
let retryMs = 500;

export const eventsConnected = () => connected;
const slowPollMs = () => Number(sessionStorage.getItem(SLOW_KEY)) || 30_000;

function setState(state) {
  connected = state === "live";
  document.documentElement.dataset.events = state;
}

function connect() {
  if (socket || !token.get()) return;
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/v1/events`);
  socket = ws;
  setState("connecting");
  ws.onopen = () => ws.send(JSON.stringify({ token: token.get() }));
  ws.onmessage = (m) => {
    let ev;
    try { ev = JSON.parse(m.data); } catch { return; }
    if (ev.type === "hello") {
      setState("live");
      retryMs = 500;
      for (const l of listeners) l.reload(); // what changed while it was down
    } else if (ev.type === "resync") {
      for (const l of listeners) l.reload();
    } else if (ev.type !== "error") {
      for (const l of listeners) l.offer(ev);
    }
  };
  ws.onclose = () => {
    if (socket !== ws) return;
    socket = null;
    setState("down");
    for (const l of listeners) l.down();
    if (token.get()) setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 15_000);
  };
}

/** Close the socket (sign-out): the next live() opens one with the new token. */
export function closeEvents() {
  const ws = socket;
  socket = null;
  setState("down");
  if (ws) ws.close();
}

/** Run `fn` now, again when an event of `types` (that `match` accepts) arrives, and every `ms` while the socket is
 * down (every slow poll while it is up); stops when `signal` aborts. Errors go to `onError`, the page goes on. */
export function live(fn, { types, match = () => true, ms = 3000 }, signal, onError = showError) {
  connect();
  let timer = null;
  let soon = null;
  let running = false;
  let again = false;
  const run = async () => {
    if (signal.aborted) return;
    if (running) { again = true; return; }
    running = true;
    clearTimeout(timer);
    try { await fn(); } catch (err) { if (!signal.aborted) onError(err); }
    running = false;
    if (signal.aborted) return;
    if (again) { again = false; run(); return; }
    timer = setTimeout(run, connected ? slowPollMs() : ms);
  };
  const reload = () => {
    if (soon === null) soon = setTimeout(() => { soon = null; run(); }, DEBOUNCE_MS);
  };
  const listener = {
    offer: (ev) => { if (types.includes(ev.type) && match(ev)) reload(); },
    reload,
    down: () => { clearTimeout(timer); if (!running) timer = setTimeout(run, ms); },
  };
  listeners.add(listener);
  signal.addEventListener("abort", () => {
    listeners.delete(listener);
    clearTimeout(timer);
    clearTimeout(soon);
  });
  run();
}
