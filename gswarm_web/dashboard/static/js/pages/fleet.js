// Fleet: every node (status, heartbeat, CPU, DRAM, disk, models in DRAM) and every GPU as a tile (utilisation,
// memory used / total and what gswarm's replicas hold, a sparkline, models on it), updated from the live frames.
// The DOM is built once per node and GPU and updated in place, so 1,000 nodes x 8 GPUs keep up with 1 s frames:
// the first draw builds every card but the GPU tiles of the first screenful only; the other cards get theirs a slice
// at a time after that paint, or at once when they scroll into view.

import { live } from "../events.js";
import { all } from "../api.js";
import { history, latest, gpuKey } from "../frames.js";
import { add, fill, fmtAge, fmtBytes, fmtPct, h, poll, showError } from "../ui.js";

const FRAME_MS = 1000;
const NODES_MS = 3000;
const MODELS_MS = 10000;
const SPARK = 60; // points in a sparkline
const EAGER = 24; // cards whose GPU tiles the first draw builds (more than a screenful)
const SLICE_MS = 8; // time given to building the other cards' tiles per task, so the page keeps answering

export async function render(root, _args, signal) {
  const started = performance.now();
  const summary = h("div", { class: "summary panel" });
  const list = h("div", { id: "nodes" });
  const status = h("div", { class: "muted small", id: "fleet-status" });
  add(root, h("h1", null, "Fleet"), summary, status, list);

  const cards = new Map(); // node name -> card (elements to update)
  // Only the cards on screen (and a margin) are updated each second; the others when they scroll into view.
  const visible = new Set();
  const io = new IntersectionObserver((entries) => {
    for (const e of entries) {
      const name = e.target.dataset.node;
      if (!e.isIntersecting) { visible.delete(name); continue; }
      visible.add(name);
      const card = cards.get(name);
      if (card && !card.filled) updateNode(card, state.byName.get(name) || null, state.frames[name], Date.now() / 1000);
    }
  }, { rootMargin: "300px" });
  signal.addEventListener("abort", () => io.disconnect());
  const state = { nodes: null, nodesAt: 0, frames: {}, placed: new Map(), held: new Map(), byName: new Map() };
  const unfilled = []; // cards still without their GPU tiles, in page order

  function fillSome() {
    const until = performance.now() + SLICE_MS;
    const now = Date.now() / 1000;
    while (unfilled.length && performance.now() < until) {
      const name = unfilled.shift();
      const card = cards.get(name);
      if (card && !card.filled) updateNode(card, state.byName.get(name) || null, state.frames[name], now);
    }
    if (unfilled.length && !signal.aborted) setTimeout(fillSome, 0);
  }

  async function loadNodes() {
    state.nodes = await all("/nodes", "nodes", { signal });
    state.nodesAt = performance.now();
  }
  async function loadPlacement() {
    const [models, services] = await Promise.all([
      all("/models", "models", { signal }),
      all("/services", "services", { signal }),
    ]);
    const placed = new Map(); // device -> Set(model names)
    const add = (device, name) => {
      if (!placed.has(device)) placed.set(device, new Set());
      placed.get(device).add(name);
    };
    for (const m of models) for (const d of m.locations || []) add(d, m.model_name);
    const pids = new Map(); // node -> Map(pid -> model)
    for (const svc of services) {
      for (const r of svc.instances || []) {
        if (["stopped", "failed"].includes(r.status)) continue;
        add(r.device, svc.model_name);
        if (r.pid) {
          if (!pids.has(r.node)) pids.set(r.node, new Map());
          pids.get(r.node).set(r.pid, svc.model_name);
        }
      }
    }
    state.placed = placed;
    state.held = pids;
  }

  // The frames alone (one call) draw every node with GPUs and its tiles; the node table (status, heartbeat, disk)
  // and where models are are asked for once that answer is in, and fill in as they arrive: the first paint waits for
  // one answer only, which no heavier one (a whole fleet's node table) holds up on the server.
  const thenDraw = (p) => p.then(
    () => { if (!signal.aborted) draw(); },
    (err) => { if (!signal.aborted) showError(err); },
  );
  state.frames = (await latest(signal)).nodes;
  thenDraw(loadNodes());
  thenDraw(loadPlacement());
  const t0 = performance.now();
  draw();
  root.dataset.firstDrawMs = (performance.now() - t0).toFixed(1);
  // at the frame that paints it: the time since this view started, and since the document's navigation began
  requestAnimationFrame((at) => {
    performance.measure("fleet-first-paint", { start: started, end: at });
    root.dataset.renderMs = (at - started).toFixed(1);
    root.dataset.firstPaintMs = at.toFixed(1);
  });

  poll(async () => {
    const t0 = performance.now();
    state.frames = (await latest(signal)).nodes;
    draw();
    const ms = performance.now() - t0;
    performance.measure("fleet-update", { start: t0, end: performance.now() });
    root.dataset.updateMs = ms.toFixed(1);
    root.dataset.updates = String(Number(root.dataset.updates || 0) + 1);
  }, FRAME_MS, signal);
  // GPU tiles are the frames' samples, polled above; the node table and where models are follow the changes.
  setTimeout(() => live(async () => { await loadNodes(); draw(); }, { types: ["node"], ms: NODES_MS }, signal), NODES_MS);
  setTimeout(() => live(async () => { await loadPlacement(); draw(); }, { types: ["task", "step", "service", "replica"], ms: MODELS_MS }, signal), MODELS_MS);

  function draw() {
    const now = Date.now() / 1000;
    let gpus = 0;
    let utilSum = 0;
    let utilN = 0;
    let memUsed = 0;
    let memTotal = 0;
    const counts = {};
    const byName = new Map((state.nodes || []).map((n) => [n.name, n]));
    state.byName = byName;
    // until the node table has come, the nodes that sent frames
    const names = new Set(state.nodes ? byName.keys() : Object.keys(state.frames));
    let added = false;
    const fresh = [];
    for (const name of names) {
      const node = byName.get(name) || null;
      const st = node ? node.status : "unknown";
      counts[st] = (counts[st] || 0) + 1;
      let card = cards.get(name);
      if (!card) {
        card = nodeCard(name);
        cards.set(name, card);
        io.observe(card.el);
        added = true;
        fresh.push(name);
      }
      const frame = state.frames[name];
      if (visible.has(name)) updateNode(card, node, frame, now);
      else if (!card.filled) updateHead(card, node, frame);
      for (const g of frame ? frame.gpus || [] : []) {
        gpus++;
        if (g.utilization_percent !== undefined) { utilSum += g.utilization_percent; utilN++; }
        memUsed += g.memory_used_bytes || 0;
        memTotal += g.memory_total_bytes || 0;
      }
    }
    if (added) { // keep the cards in name order (appending moves them)
      const byPage = (a, b) => a.localeCompare(b, undefined, { numeric: true });
      const sorted = [...cards.keys()].sort(byPage);
      list.append(...sorted.map((n) => cards.get(n).el));
      // the first cards on the page get their tiles now, the others after this paint
      fresh.sort(byPage);
      let eager = EAGER - [...cards.values()].filter((c) => c.filled).length;
      const start = !unfilled.length;
      for (const name of fresh) {
        const card = cards.get(name);
        if (card.filled) continue;
        if (eager-- > 0) updateNode(card, byName.get(name) || null, state.frames[name], now);
        else unfilled.push(name);
      }
      if (start && unfilled.length) setTimeout(fillSome, 0);
    }
    for (const [name, card] of cards) {
      if (!names.has(name)) {
        io.unobserve(card.el);
        card.el.remove();
        cards.delete(name);
      }
    }
    fill(summary,
      stat("nodes", String(names.size)),
      ...Object.entries(counts).map(([k, v]) => stat(k, String(v))),
      stat("GPUs", String(gpus)),
      stat("mean utilisation", utilN ? fmtPct(utilSum / utilN) : "—"),
      stat("GPU memory", `${fmtBytes(memUsed)} / ${fmtBytes(memTotal)}`),
    );
    status.textContent = names.size || !state.nodes ? "" : "No node has registered yet: start one with `gswarm client connect`.";
  }

  // The head of a card (status, heartbeat, CPU, DRAM, disk), without its GPU tiles.
  function updateHead(card, node, frame) {
    const st = node ? node.status : "unknown";
    if (card.last.status !== st) {
      card.last.status = st;
      card.status.className = `badge s-${st}`;
      card.status.textContent = st;
      card.el.dataset.status = st;
    }
    const n = node || {};
    // a node config.yaml declares that has not joined (`missing`) has never been seen
    const age = node && node.seconds_since_seen != null ? node.seconds_since_seen + (performance.now() - state.nodesAt) / 1000 : null;
    card.seen.textContent = `heartbeat ${fmtAge(age)}`;
    const host = (frame && frame.host) || {};
    card.cpu.textContent = `CPU ${fmtPct(host.cpu_percent ?? n.cpu_percent)} of ${n.cpu_count ?? "?"} cores`;
    const dramUsed = host.dram_used_bytes ?? (n.dram_total_bytes ?? 0) - (n.dram_available_bytes ?? 0);
    card.dram.textContent = `DRAM ${fmtBytes(dramUsed)} / ${fmtBytes(n.dram_total_bytes)}`;
    const disk = (n.storage || {}).disk;
    card.disk.textContent = disk ? `disk ${fmtBytes(disk.used_bytes)} / ${fmtBytes(disk.total_bytes)}` : "disk —";
    const inDram = [...(state.placed.get(`${card.el.dataset.node}:dram`) || [])];
    card.dramModels.textContent = inDram.length ? `in DRAM: ${inDram.join(", ")}` : "";
    // the serving engines it can run, with their versions (what `engine: auto` chooses among)
    const engines = Object.entries(n.engines || {}).sort(([a], [b]) => a.localeCompare(b));
    card.engines.textContent = engines.length
      ? `engines: ${engines.map(([name, e]) => (e.version ? `${name} ${e.version}` : name)).join(", ")}` : "";
  }

  function updateNode(card, node, frame, now) {
    updateHead(card, node, frame);
    card.filled = true;
    const n = node || {};
    // GPUs: what the heartbeat lists, with the frame's readings on top
    const rows = new Map((n.gpus || []).map((g) => [g.index, { ...g }]));
    for (const g of frame ? frame.gpus || [] : []) rows.set(g.index, { ...(rows.get(g.index) || {}), ...g });
    const stale = !frame || now - frame.time > 10;
    const held = state.held.get(card.el.dataset.node);
    for (const [index, g] of rows) {
      let tile = card.tiles.get(index);
      if (!tile) {
        tile = gpuTile(gpuKey(card.el.dataset.node, index));
        card.tiles.set(index, tile);
        card.gpus.append(tile.el);
      }
      updateTile(tile, g, frame, stale, held);
    }
    card.noGpu.hidden = rows.size > 0;
  }

  function updateTile(tile, g, frame, stale, held) {
    const key = tile.el.dataset.gpu;
    tile.el.classList.toggle("stale", stale);
    tile.el.dataset.util = g.utilization_percent ?? "";
    tile.el.dataset.seq = frame ? frame.seq : "";
    tile.name.textContent = `gpu${g.index} · ${g.name || ""}`;
    tile.util.textContent = fmtPct(g.utilization_percent);
    tile.utilBar.style.width = `${g.utilization_percent || 0}%`;
    const total = g.memory_total_bytes;
    const used = g.memory_used_bytes;
    tile.mem.textContent = `${fmtBytes(used)} / ${fmtBytes(total)}`;
    tile.memBar.style.width = total ? `${(100 * (used || 0)) / total}%` : "0%";
    let ours = 0;
    for (const p of g.processes || []) if (held && held.has(p.pid)) ours += p.gpu_memory_bytes || 0;
    tile.ours.textContent = ours ? `gswarm ${fmtBytes(ours)}` : "";
    const models = [...(state.placed.get(key) || [])];
    tile.models.textContent = models.length ? models.join(", ") : "no model";
    tile.models.title = tile.models.textContent;
    const hist = history.get(key);
    if (hist) {
      const u = hist.util.slice(-SPARK);
      const step = 100 / (SPARK - 1);
      const x0 = 100 - step * (u.length - 1);
      tile.spark.setAttribute("points", u.map((v, i) => `${(x0 + i * step).toFixed(1)},${(22 - ((v || 0) * 21) / 100).toFixed(1)}`).join(" "));
    }
  }
}

function stat(label, value) {
  return h("div", { "data-stat": label }, h("b", null, value), h("span", { class: "muted small" }, label));
}

// Cloned from templates: 1600 tiles built element by element cost several times more.
const NODE = document.createElement("template");
NODE.innerHTML = `<section class="node"><div class="node-head"><span class="name"></span><span class="badge"></span>
<span class="stat"></span><span class="stat"></span><span class="stat"></span><span class="stat"></span>
<span class="muted"></span><span class="muted engines"></span></div><div class="gpus"></div><div class="muted small">no GPU</div></section>`;
const TILE = document.createElement("template");
TILE.innerHTML = `<div class="gpu"><div class="top"><span class="muted"></span><span class="util"></span></div>
<div class="bar"><span></span></div><svg class="spark" viewBox="0 0 100 22" preserveAspectRatio="none"><polyline points="">
</polyline></svg><div class="top"><span></span><span class="muted"></span></div><div class="bar mem"><span></span></div>
<div class="models"></div></div>`;

function nodeCard(name) {
  const el = NODE.content.firstElementChild.cloneNode(true);
  el.dataset.node = name;
  const [head, gpus, noGpu] = el.children;
  const [nameEl, status, seen, cpu, dram, disk, dramModels, engines] = head.children;
  nameEl.textContent = name;
  noGpu.hidden = true; // until its GPUs are drawn
  return { el, status, seen, cpu, dram, disk, dramModels, engines, gpus, noGpu, tiles: new Map(), last: {} };
}

function gpuTile(key) {
  const el = TILE.content.firstElementChild.cloneNode(true);
  el.dataset.gpu = key;
  const [top, ubar, spark, top2, mbar, models] = el.children;
  return {
    el,
    name: top.children[0],
    util: top.children[1],
    utilBar: ubar.firstElementChild,
    spark: spark.firstElementChild,
    mem: top2.children[0],
    ours: top2.children[1],
    memBar: mbar.firstElementChild,
    models,
  };
}
