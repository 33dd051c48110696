// Models: the registry, where each model is (node x tier), services with their replicas, the gateway URL and each
// one's autoscaling decisions, actions (download, copy, move, serve with `auto`, scale, stop) with the placement
// decision shown before they run, and operations with their progress.

import { live } from "../events.js";
import { all, del, get, patch, post } from "../api.js";
import {
  add, badge, bar, canWrite, errorBox, fill, fmtBytes, fmtTime, h, readButton, table, writeButton,
} from "../ui.js";

export async function render(root, _args, signal) {
  const registry = h("div", { id: "models-registry" });
  const matrix = h("div", { id: "models-matrix" });
  const services = h("div", { id: "services" });
  const scalingView = h("div", { id: "service-scaling" });
  const ops = h("div", { id: "operations" });
  const state = { models: [], nodes: [] };
  const actions = canWrite() ? actionPanel(state) : null;
  add(root, 
    h("h1", null, "Models"),
    canWrite() ? registerForm() : null,
    h("h2", null, "Registry"), registry,
    h("h2", null, "Where they are (node × tier)"), matrix,
    actions ? [h("h2", null, "Actions"), actions.el] : null,
    h("h2", null, "Services"), services, scalingView,
    h("h2", null, "Operations"), ops,
  );

  live(async () => {
    const [models, nodes] = await Promise.all([all("/models", "models", { signal }), all("/nodes", "nodes", { signal })]);
    state.models = models;
    state.nodes = nodes;
    fill(registry, table(
      [
        { label: "model", get: (m) => h("b", null, m.model_name) },
        { label: "type", get: (m) => m.model_type },
        { label: "size", get: (m) => fmtBytes(m.model_size), cls: "num" },
        { label: "status", get: (m) => [badge(m.status), m.status_message ? h("div", { class: "small muted" }, m.status_message) : null] },
        { label: "locations", get: (m) => (m.locations || []).join(", ") || "—" },
        { label: "serving at", get: (m) => Object.entries(m.services || {}).map(([d, u]) => h("div", { class: "small" }, `${d} → ${u}`)) },
        { label: "source", get: (m) => h("span", { class: "small mono" }, m.source_url || "") },
      ],
      models,
      { rowAttrs: (m) => ({ "data-model": m.model_name }), empty: "no model registered" },
    ));
    fill(matrix, placementMatrix(models, nodes));
    if (actions) actions.refresh();
  }, { types: ["model", "task", "step", "service", "replica", "node"], ms: 3000 }, signal);

  live(async () => {
    const list = await all("/services", "services", { signal });
    const gateway = `${location.origin}/v1`;
    fill(services, table(
      [
        { label: "service", get: (s) => h("span", { class: "mono" }, s.id) },
        { label: "model", get: (s) => s.model_name },
        { label: "status", get: (s) => badge(s.status) },
        { label: "replicas", get: (s) => `${s.ready_replicas} / ${s.replicas} ready`, cls: "num" },
        { label: "autoscaling", get: (s) => h("span", { class: "small" }, policyText(s.autoscaling)) },
        { label: "instances", get: (s) => (s.instances || []).map((r) => h("div", { class: "small" },
          badge(r.status), ` ${r.device}`, r.healthy === false ? " (unhealthy)" : r.healthy ? " (healthy)" : "")) },
        { label: "gateway", get: (s) => (s.gateway_model ? h("div", { class: "small mono" }, `${gateway}  model: ${s.gateway_model}`) : "—") },
        { label: "", get: (s) => [readButton("Scaling", () => { shown.id = s.id; return showScaling(); }, { "data-scaling": s.id }),
          serviceActions(s)] },
      ],
      list,
      { rowAttrs: (s) => ({ "data-service": s.id }), empty: "no service" },
    ));
  }, { types: ["service", "replica"], ms: 3000 }, signal);

  // one service's autoscaling: its policy, the load the autoscaler sees and its decisions (GET /services/{id}/scaling)
  const shown = { id: null };
  const showScaling = async () => {
    if (!shown.id) return;
    fill(scalingView, scalingPanel(await get(`/services/${encodeURIComponent(shown.id)}/scaling`, { signal })));
  };
  live(showScaling, { types: ["service", "replica"], ms: 2000 }, signal);

  live(async () => {
    const body = await get("/queue/tasks?per_page=100", { signal });
    const rows = body.tasks.filter((t) => t.model_name || t.service_id).slice(0, 30);
    fill(ops, operationsTable(rows));
  }, { types: ["task"], ms: 2000 }, signal);
}

function registerForm() {
  const name = h("input", { placeholder: "name", id: "reg-name" });
  const type = h("input", { placeholder: "type (llm, embedding, …)", id: "reg-type" });
  const source = h("input", { placeholder: "source_url (hf://org/model, file:///path)", id: "reg-source", size: 40 });
  const out = h("span");
  return h("div", { class: "panel row" }, h("b", null, "Register"), name, type, source,
    writeButton("Register", async () => {
      fill(out);
      try {
        await post("/models", { model_name: name.value, model_type: type.value, source_url: source.value });
        fill(out, h("span", { class: "small" }, `registered ${name.value}`));
      } catch (err) { fill(out, errorBox(err)); }
    }), out);
}

function tiersOf(node) {
  return ["disk", "dram", ...(node.gpus || []).map((g) => `gpu${g.index}`)];
}

function placementMatrix(models, nodes) {
  if (!nodes.length) return h("p", { class: "muted" }, "no node");
  const head1 = h("tr", null, h("th"), nodes.map((n) => h("th", { colSpan: tiersOf(n).length }, n.name)));
  const head2 = h("tr", null, h("th", null, "model"), nodes.map((n) => tiersOf(n).map((t) => h("th", { class: "small" }, t))));
  const rows = models.map((m) => {
    const here = new Set(m.locations || []);
    const serving = new Set(Object.keys(m.services || {}));
    return h("tr", { "data-model": m.model_name }, h("td", null, m.model_name), nodes.map((n) => tiersOf(n).map((t) => {
      const dev = `${n.name}:${t}`;
      return h("td", { class: "cell", "data-device": dev },
        here.has(dev) ? h("span", { class: "dot", title: `${m.model_name} on ${dev}` }) : "",
        serving.has(dev) ? h("span", { title: "serving" }, " ▶") : "");
    })));
  });
  return h("div", { class: "matrix" }, h("table", null, h("thead", null, head1, head2),
    h("tbody", null, rows.length ? rows : h("tr", null, h("td", { class: "muted" }, "no model")))));
}

function policyText(p) {
  if (!p) return "fixed";
  const target = p.target_in_flight != null ? `${p.target_in_flight} in flight / replica`
    : p.target_engine_waiting != null ? `${p.target_engine_waiting} waiting / engine queue`
    : `queue wait ${p.target_queue_wait_s} s`;
  return `${p.min_replicas}–${p.max_replicas}, ${target}`;
}

function scalingPanel(body) {
  const inFlight = Object.values(body.in_flight || {}).reduce((a, b) => a + b, 0);
  const policy = body.autoscaling;
  return h("div", { class: "panel", "data-scaling-of": body.service_id },
    h("h3", null, `Scaling of ${body.service_id}`),
    h("p", { class: "small" }, `${body.replicas} replicas (${body.ready_replicas} ready, ${body.draining_replicas} draining) · `,
      `load now: ${inFlight} in flight, ${body.waiting} waiting · autoscaling: ${policyText(policy)}`,
      policy ? ` · up after ${policy.scale_up_delay_s} s, down after ${policy.scale_down_delay_s} s` : ""),
    table(
      [
        { label: "at", get: (e) => fmtTime(e.at) },
        { label: "replicas", get: (e) => `${e.from_replicas} → ${e.to_replicas} (${e.direction})`, cls: "num" },
        { label: "why", get: (e) => e.reason },
        { label: "load seen", get: (e) => h("span", { class: "small mono" }, Object.entries(e.load || {}).map(([k, v]) => `${k} ${v}`).join(", ") || "—") },
      ],
      body.events || [],
      { rowAttrs: (e) => ({ "data-direction": e.direction }), empty: "no scaling decision yet" },
    ));
}

function serviceActions(svc) {
  if (!canWrite() || ["stopped", "failed"].includes(svc.status)) return "";
  const count = h("input", { type: "number", min: 1, max: 64, value: svc.replicas, size: 3 });
  count.style.width = "4em";
  return h("span", { class: "row" }, count,
    writeButton("Scale", () => patch(`/services/${encodeURIComponent(svc.id)}`, { replicas: Number(count.value) })),
    writeButton("Stop", () => del(`/services/${encodeURIComponent(svc.id)}`), { class: "danger" }));
}

function operationsTable(rows) {
  return table(
    [
      { label: "task", get: (t) => h("span", { class: "mono small" }, t.task_id.slice(0, 8)) },
      { label: "kind", get: (t) => t.kind },
      { label: "model", get: (t) => t.model_name || t.service_id || "" },
      { label: "status", get: (t) => badge(t.status) },
      { label: "from → to", get: (t) => `${t.source_device || "—"} → ${t.target_device || "—"}` },
      { label: "progress", get: (t) => progress(t.progress) },
      { label: "created", get: (t) => fmtTime(t.created_at) },
      { label: "error", get: (t) => (t.error ? h("span", { class: "error small" }, t.error.message || "") : "") },
    ],
    rows,
    { rowAttrs: (t) => ({ "data-task": t.task_id }), empty: "no operation yet" },
  );
}

export function progress(p) {
  if (!p) return "";
  const label = p.total_bytes ? `${fmtBytes(p.done_bytes)} / ${fmtBytes(p.total_bytes)}` : p.phase || "";
  return h("div", null, p.percent !== null && p.percent !== undefined ? bar(p.percent / 100) : null,
    h("span", { class: "small muted" }, `${label}${p.percent !== null && p.percent !== undefined ? ` · ${p.percent}%` : ""}`));
}

/** Pick a model and an action; Plan asks GET /placement what `auto` would choose; Run is offered only after. */
function actionPanel(state) {
  const model = h("select", { id: "act-model" });
  const action = h("select", { id: "act-action" }, ["serve", "download", "copy", "move"].map((a) => h("option", { value: a }, a)));
  const target = h("input", { id: "act-target", value: "auto", size: 16, title: "a device (node1:gpu0), auto or auto:<gpu|cpu|dram|disk>" });
  const source = h("input", { id: "act-source", value: "auto", size: 16 });
  const replicas = h("input", { id: "act-replicas", type: "number", min: 1, max: 64, value: 1 });
  replicas.style.width = "4em";
  const plan = h("div", { class: "decision", id: "decision" });
  const out = h("div");
  let planned = null;
  const run = writeButton("Run", async () => {
    fill(out);
    const m = encodeURIComponent(model.value);
    try {
      let res;
      if (action.value === "serve") res = await post("/services", { model_name: model.value, device: target.value, replicas: Number(replicas.value) });
      else if (action.value === "download") res = await post(`/models/${m}/download`, { target_device: target.value });
      else res = await post(`/models/${m}/${action.value}`, { source_device: source.value, target_device: target.value });
      fill(out, h("div", { class: "okbox" }, `accepted: ${res.task_id ? `task ${res.task_id}` : ""} ${res.id ? `service ${res.id}` : ""}`));
    } catch (err) { fill(out, errorBox(err)); }
  }, { id: "act-run", class: "primary", disabled: true });
  const invalidate = () => { planned = null; run.disabled = true; fill(plan); };
  for (const el of [model, action, target, source, replicas]) el.addEventListener("change", invalidate);
  const planBtn = readButton("Plan", async () => {
    fill(out);
    const kind = /^auto:(\w+)$/.exec(target.value);
    const q = new URLSearchParams({ model: model.value, action: action.value });
    if (kind) q.set("kind", kind[1]);
    try {
      const d = await get(`/placement?${q}`);
      planned = d;
      fill(plan, decision(d, target.value));
      run.disabled = false;
    } catch (err) { fill(plan, errorBox(err)); }
  }, { id: "act-plan" });
  const el = h("div", { class: "panel", id: "model-actions" },
    h("div", { class: "row" }, h("label", null, "model", model), h("label", null, "action", action),
      h("label", null, "target", target), h("label", null, "source (copy, move)", source),
      h("label", null, "replicas (serve)", replicas), planBtn, run),
    h("p", { class: "small muted" }, "Plan shows what placement decides before anything runs; Run sends it."),
    plan, out);
  return {
    el,
    refresh() {
      const names = state.models.map((m) => m.model_name);
      const now = [...model.options].map((o) => o.value);
      if (names.join() !== now.join()) {
        const keep = model.value;
        fill(model, names.map((n) => h("option", { value: n, selected: n === keep }, n)));
        if (planned) invalidate();
      }
    },
  };
}

function decision(d, target) {
  const explicit = !target.startsWith("auto");
  return h("div", null,
    h("p", null, explicit ? `You named ${target}; for comparison, auto would choose ` : "auto chooses ",
      h("b", null, d.chosen), ` (from ${d.loaded_from}, about ${Number(d.load_seconds).toFixed(1)} s to load` +
      `${d.need_bytes ? `, needs ${fmtBytes(d.need_bytes)}` : ""})`),
    table(
      [
        { label: "candidate", get: (c) => c.device },
        { label: "load from", get: (c) => c.loaded_from },
        { label: "load s", get: (c) => Number(c.load_seconds).toFixed(1), cls: "num" },
        { label: "free", get: (c) => fmtBytes(c.free_bytes), cls: "num" },
        { label: "replicas", get: (c) => String(c.replicas ?? 0), cls: "num" },
        { label: "why not", get: (c) => (c.chosen ? "chosen" : c.lost || "") },
      ],
      d.candidates || [],
      { rowAttrs: (c) => ({ class: c.chosen ? "chosen" : null }) },
    ));
}

