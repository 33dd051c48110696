// The dashboard's shell: sign-in with a token (kept for this browser session), who am I, navigation, routing.

import { ApiError, get, token } from "./api.js";
import { closeEvents } from "./events.js";
import { errorBox, fill, h, session } from "./ui.js";
import * as fleet from "./pages/fleet.js";
import * as models from "./pages/models.js";
import * as workflows from "./pages/workflows.js";
import * as queue from "./pages/queue.js";
import * as profiler from "./pages/profiler.js";
import * as scheduling from "./pages/scheduling.js";
import * as data from "./pages/data.js";

const PAGES = { fleet, models, workflows, queue, profiler, scheduling, data };
const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
let current = null; // AbortController of the page on screen: its loaders stop when another is shown

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "fleet", args: parts.slice(1) };
}

function renderNav(active) {
  fill(nav,
    ...Object.keys(PAGES).map((p) =>
      h("a", { href: `#/${p}`, class: p === active ? "active" : null, "data-nav": p }, p[0].toUpperCase() + p.slice(1))),
    h("a", { href: "/api/v1/docs", target: "_blank" }, "API docs"),
  );
}

function signOut() {
  closeEvents();
  token.clear();
  sessionStorage.removeItem(ME);
  session.me = null;
  route();
}

function renderLogin(message) {
  fill(nav);
  fill(who);
  const input = h("input", { type: "password", id: "token", placeholder: "gsw_…", autocomplete: "off" });
  const form = h(
    "form",
    { class: "panel login", id: "login" },
    h("h1", null, "Sign in"),
    h("p", { class: "muted small" },
      "Paste an API token (gswarm up writes the admin token to $GSWARM_HOME/token). It is kept for this browser session only."),
    input,
    message ? errorBox(message) : null,
    h("button", { class: "primary", type: "submit" }, "Sign in"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    sessionStorage.removeItem(ME);
    token.set(input.value.trim());
    route();
  });
  fill(main, form);
  input.focus();
}

const ME = "gswarm.me";

/** Who the token belongs to: asked once per browser session, then remembered beside the token (a reload asks again
 * in the background; the API decides what the token may do in any case, this only hides buttons). */
async function whoAmI() {
  if (session.me) return session.me;
  const cached = sessionStorage.getItem(ME);
  if (cached) {
    session.me = JSON.parse(cached);
    get("/tokens/self").then((me) => sessionStorage.setItem(ME, JSON.stringify(me)), () => {});
  } else {
    session.me = await get("/tokens/self");
    sessionStorage.setItem(ME, JSON.stringify(session.me));
  }
  fill(who, h("span", null,
    h("span", { id: "me", "data-role": session.me.role }, `${session.me.name} · ${session.me.role} `),
    session.me.can_write ? null : h("span", { class: "badge s-skipped", id: "read-only" }, "read only"),
    " ",
    h("button", { onclick: signOut, id: "signout" }, "Sign out")));
  return session.me;
}

async function route() {
  if (current) current.abort();
  current = new AbortController();
  if (!token.get()) return renderLogin();
  try {
    await whoAmI();
  } catch (err) {
    token.clear();
    sessionStorage.removeItem(ME);
    session.me = null;
    return renderLogin(err instanceof ApiError && err.status === 401 ? "That token is not valid." : err);
  }
  const { page, args } = parseRoute();
  const mod = PAGES[page] || fleet;
  renderNav(PAGES[page] ? page : "fleet");
  const root = h("div", { id: `page-${page}`, class: "page" });
  fill(main, root);
  try {
    await mod.render(root, args, current.signal);
  } catch (err) {
    root.append(errorBox(err));
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("gswarm:unauthorized", () => {
  if (!session.me) return;
  closeEvents();
  token.clear();
  sessionStorage.removeItem(ME);
  session.me = null;
  renderLogin("The API no longer accepts this token; sign in again.");
});
route();
