// Workflows: the list, submitting YAML (paste, upload or an example) with validation errors shown beside the
// action and field they name, and one workflow as its DAG coloured by step status with the step table, live.

import { ApiError, api, get, post } from "../api.js";
import { live } from "../events.js";
import {
  add, badge, canWrite, errorBox, fill, fmtDuration, fmtTime, h, json, s, table, writeButton,
} from "../ui.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

export async function render(root, args, signal) {
  if (args[0]) return renderOne(root, args[0], signal);
  add(root, h("h1", null, "Workflows"));
  if (canWrite()) add(root, await submitPanel());
  const listBox = h("div", { id: "workflow-list" });
  add(root, h("h2", null, "Recent"), listBox);
  live(async () => {
    const body = await get("/workflows?per_page=50", { signal });
    fill(listBox,
      table(
        [
          { label: "name", get: (w) => h("a", { href: `#/workflows/${w.id}` }, w.name) },
          { label: "status", get: (w) => badge(w.status) },
          { label: "steps", get: (w) => Object.entries(w.step_counts || {}).map(([k, v]) => `${k} ${v}`).join(", ") },
          { label: "created", get: (w) => fmtTime(w.created_at) },
          { label: "took", get: (w) => fmtDuration(w.started_at || w.created_at, w.finished_at) },
          { label: "id", get: (w) => h("span", { class: "mono" }, w.id) },
        ],
        body.workflows,
        { rowAttrs: (w) => ({ "data-workflow": w.id, "data-status": w.status }), empty: "no workflow yet" },
      ),
      body.total > body.workflows.length ? h("p", { class: "muted small" }, `newest 50 of ${body.total}`) : null,
    );
  }, { types: ["workflow", "step"], ms: 2000 }, signal);
}

async function submitPanel() {
  const text = h("textarea", { id: "workflow-yaml", rows: 18, spellcheck: false, placeholder: "name: my-workflow\nactions:\n  - action_id: a\n    action_type: noop" });
  const result = h("div", { id: "submit-result" });
  const annotated = h("div", { id: "annotated" });
  const file = h("input", { type: "file", accept: ".yaml,.yml,.json", id: "workflow-file" });
  file.addEventListener("change", async () => {
    if (file.files[0]) text.value = await file.files[0].text();
    clear();
  });
  let examples = [];
  try { examples = (await get("/workflows/examples")).examples; } catch { /* offered when the API has them */ }
  const pick = h("select", { id: "example" }, h("option", { value: "" }, "an example…"),
    examples.flatMap((e) => [
      h("option", { value: `original:${e.name}` }, `${e.name} (original)`),
      h("option", { value: `runnable:${e.name}` }, `${e.name} (auto devices)`),
    ]));
  pick.addEventListener("change", () => {
    const [kind, name] = pick.value.split(":");
    const ex = examples.find((e) => e.name === name);
    if (ex) text.value = ex[kind];
    clear();
  });
  const clear = () => { fill(result); fill(annotated); };

  async function send(path) {
    clear();
    try {
      const body = await api("POST", path, { body: text.value, headers: { "Content-Type": "application/yaml" } });
      if (path.endsWith("/validate")) {
        result.append(h("div", { class: "okbox" }, `valid: ${body.name}, ${body.actions} actions in ${body.chains} chains`));
      } else {
        location.hash = `#/workflows/${body.id}`;
      }
    } catch (err) {
      result.append(errorBox(err));
      if (err instanceof ApiError) annotated.append(annotate(text.value, err.fieldErrors()));
    }
  }
  return h(
    "div", { class: "panel", id: "submit" },
    h("div", { class: "row" }, h("b", null, "Submit a workflow"), pick, file),
    h("div", { class: "editor" }, h("div", null, text), h("div", null, result, annotated)),
    h("div", { class: "row" },
      writeButton("Validate", () => send("/workflows/validate"), { id: "validate" }),
      writeButton("Submit", () => send("/workflows"), { id: "submit-workflow", class: "primary" })),
  );
}

/** The document with each error placed under the line of the action and field it names (`actions[b].field`). */
export function annotate(text, errors) {
  const lines = text.split("\n");
  const notes = new Map(); // line index -> [error]
  for (const e of errors) {
    const at = locate(lines, e.field || "");
    if (!notes.has(at)) notes.set(at, []);
    notes.get(at).push(e);
  }
  return h("div", { class: "annotated" }, lines.map((line, i) => [
    h("div", { class: notes.has(i) ? "hit" : null }, h("span", { class: "ln" }, String(i + 1)), line),
    (notes.get(i) || []).map((e) => {
      const { action, field } = parseField(e.field || "");
      return h("div", { class: "field-error", "data-action": action, "data-field": field }, `${e.field}: ${e.message}`);
    }),
  ]));
}

function parseField(path) {
  const m = /^actions\[([^\]]+)\](?:\.([A-Za-z0-9_]+))?/.exec(path);
  if (m) return { action: m[1], field: m[2] || "" };
  return { action: "", field: path.split(/[.[]/)[0] };
}

function locate(lines, path) {
  const { action, field } = parseField(path);
  const esc = (x) => x.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  if (!action) {
    const i = lines.findIndex((l) => new RegExp(`^${esc(field)}\\s*:`).test(l));
    return i >= 0 ? i : 0;
  }
  const start = lines.findIndex((l) => new RegExp(`^\\s*(-\\s*)?action_id\\s*:\\s*["']?${esc(action)}["']?\\s*(#.*)?$`).test(l));
  if (start < 0) {
    const idx = /^\d+$/.test(action) ? Number(action) : -1; // actions[2]: the third item
    const items = lines.map((l, i) => (/^\s*-\s/.test(l) && i > 0 ? i : -1)).filter((i) => i >= 0);
    return idx >= 0 && items[idx] !== undefined ? items[idx] : 0;
  }
  // the item's lines: up to the next list item at the same indentation or a line indented less
  const indent = lines[start].search(/\S/);
  const itemIndent = /^\s*-/.test(lines[start]) ? indent : indent - 2;
  let end = start + 1;
  while (end < lines.length) {
    const l = lines[end];
    const ind = l.search(/\S/);
    if (ind >= 0 && (ind < itemIndent || (ind === itemIndent && /^\s*-/.test(l)))) break;
    end++;
  }
  if (field) {
    for (let i = start; i < end; i++) if (new RegExp(`^\\s*(-\\s*)?${esc(field)}\\s*:`).test(lines[i])) return i;
  }
  return start;
}

async function renderOne(root, id, signal) {
  const head = h("div", { class: "row" });
  const dagBox = h("div", { id: "dag" });
  const steps = h("div", { id: "steps" });
  const err = h("div");
  add(root, h("p", null, h("a", { href: "#/workflows" }, "← all workflows")), head, err, h("h2", null, "Graph"), dagBox,
    h("h2", null, "Steps"), steps);
  let selected = null;
  const stop = new AbortController();
  signal.addEventListener("abort", () => stop.abort());
  live(async () => {
    const wf = await get(`/workflows/${encodeURIComponent(id)}`, { signal });
    root.dataset.status = wf.status;
    fill(head,
      h("h1", { class: "grow" }, wf.name, " ", badge(wf.status)),
      h("span", { class: "muted small mono" }, wf.id),
      h("span", { class: "muted small" }, `created ${fmtTime(wf.created_at)} · took ${fmtDuration(wf.started_at || wf.created_at, wf.finished_at)}`),
      wf.status === "running"
        ? writeButton("Cancel", async () => { await post(`/workflows/${encodeURIComponent(id)}/cancel`); }, { id: "cancel", class: "danger" })
        : null,
    );
    fill(err, wf.error ? errorBox(wf.error.message || JSON.stringify(wf.error)) : "");
    fill(dagBox, dag(wf.steps, (sid) => { selected = sid; highlight(); }));
    fill(steps, stepTable(wf.steps));
    highlight();
    if (TERMINAL.has(wf.status)) stop.abort();
  }, { types: ["step", "workflow"], match: (ev) => ev.workflow_id === id || ev.id === id, ms: 1000 }, stop.signal);

  function highlight() {
    for (const tr of steps.querySelectorAll("tr[data-step]")) tr.classList.toggle("sel", tr.dataset.step === selected);
  }
}

function stepTable(rows) {
  return table(
    [
      { label: "action", get: (r) => h("b", null, r.action_id) },
      { label: "type", get: (r) => r.action_type },
      { label: "status", get: (r) => badge(r.status) },
      { label: "node", get: (r) => r.node || "—" },
      { label: "device", get: (r) => r.device || "—" },
      { label: "attempts", get: (r) => String(r.attempts ?? 0), cls: "num" },
      { label: "started", get: (r) => fmtTime(r.started_at) },
      { label: "finished", get: (r) => fmtTime(r.finished_at) },
      { label: "took", get: (r) => (r.started_at ? fmtDuration(r.started_at, r.finished_at) : "—") },
      { label: "outputs", get: (r) => json(r.outputs) },
      { label: "error", get: (r) => (r.error ? h("span", { class: "error step-error" }, r.error.message || JSON.stringify(r.error)) : "") },
    ],
    rows,
    { rowAttrs: (r) => ({ "data-step": r.action_id, "data-status": r.status }) },
  );
}

const W = 160;
const H = 46;
const GX = 56;
const GY = 14;

/** The steps as a layered DAG: a step's column is one past its deepest dependency. */
export function dag(steps, onPick) {
  const byId = new Map(steps.map((st) => [st.action_id, st]));
  const depth = new Map();
  const depthOf = (id, seen = new Set()) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0;
    seen.add(id);
    const deps = (byId.get(id)?.dependencies || []).filter((d) => byId.has(d));
    const d = deps.length ? 1 + Math.max(...deps.map((x) => depthOf(x, seen))) : 0;
    depth.set(id, d);
    return d;
  };
  const cols = [];
  for (const st of steps) {
    const d = depthOf(st.action_id);
    (cols[d] ||= []).push(st);
  }
  const pos = new Map();
  cols.forEach((col, c) => col.forEach((st, r) => pos.set(st.action_id, { x: 10 + c * (W + GX), y: 10 + r * (H + GY) })));
  const width = 20 + cols.length * (W + GX) - GX;
  const height = 20 + Math.max(1, ...cols.map((c) => c.length)) * (H + GY) - GY;
  const edges = [];
  for (const st of steps) {
    for (const d of st.dependencies || []) {
      const a = pos.get(d);
      const b = pos.get(st.action_id);
      if (!a || !b) continue;
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2;
      edges.push(s("path", { class: "edge", d: `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}`, "marker-end": "url(#arrow)" }));
    }
  }
  const nodes = steps.map((st) => {
    const p = pos.get(st.action_id);
    const sub = [st.action_type, st.device || st.node].filter(Boolean).join(" · ");
    const g = s("g", { class: "step", "data-step": st.action_id, "data-status": st.status, transform: `translate(${p.x},${p.y})` },
      s("title", null, `${st.action_id}: ${st.status}${st.error ? ` — ${st.error.message}` : ""}`),
      s("rect", { width: W, height: H, class: `f-${st.status}` }),
      s("text", { x: 8, y: 18 }, clip(st.action_id, 20)),
      s("text", { x: 8, y: 34, class: "sub" }, clip(`${st.status} · ${sub}`, 28)));
    g.addEventListener("click", () => onPick(st.action_id));
    return g;
  });
  return s("svg", { class: "dag", width, height, viewBox: `0 0 ${width} ${height}` },
    s("defs", null, s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
      s("path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa3b2" }))),
    edges, nodes);
}

const clip = (t, n) => (t.length > n ? `${t.slice(0, n - 1)}…` : t);

