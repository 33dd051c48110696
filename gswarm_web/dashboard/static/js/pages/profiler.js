// Profiler: sessions (start, stop, plot, export) and a live GPU timeline of the last minutes, with the workflow
// steps that ran on each GPU drawn as spans on the same time axis.

import { live } from "../events.js";
import { download, get, post } from "../api.js";
import { gpuTimeline } from "../charts.js";
import { history, latest } from "../frames.js";
import { add, badge, canWrite, errorBox, fill, fmtTime, h, poll, readButton, table, writeButton } from "../ui.js";

const finished = new Map(); // workflow id -> its detail, once it can no longer change

export async function render(root, _args, signal) {
  const sessions = h("div", { id: "profiler-sessions" });
  const plot = h("div", { id: "profiler-plot" });
  const timeline = h("div", { id: "timeline" });
  const minutes = h("select", { id: "window" }, [2, 5, 10].map((m) => h("option", { value: m, selected: m === 5 }, `last ${m} min`)));
  const nodeFilter = h("input", { id: "timeline-node", placeholder: "node filter", size: 12 });
  add(root, 
    h("h1", null, "Profiler"),
    canWrite() ? startForm() : null,
    h("h2", null, "Sessions"), sessions, plot,
    h("h2", null, "Live GPU timeline"),
    h("div", { class: "row small muted" }, minutes, nodeFilter,
      "Utilisation from the live frames (since this page was opened in this tab); bars: workflow steps on that GPU."),
    timeline,
  );

  live(async () => {
    const list = await get("/profiler/sessions", { signal });
    fill(sessions, table(
      [
        { label: "session", get: (x) => h("b", null, x.name) },
        { label: "status", get: (x) => badge(x.status) },
        { label: "every", get: (x) => `${x.freq_ms} ms` },
        { label: "nodes", get: (x) => (x.nodes && x.nodes.length ? x.nodes.join(", ") : "all") },
        { label: "started", get: (x) => fmtTime(x.start_time) },
        { label: "ended", get: (x) => fmtTime(x.end_time) },
        { label: "GPU frames", get: (x) => String(x.frame_count ?? "—"), cls: "num" },
        { label: "", get: (x) => h("span", { class: "row" },
          x.status === "active" ? writeButton("Stop", () => post(`/profiler/sessions/${encodeURIComponent(x.name)}/stop`), { class: "danger" }) : null,
          readButton("Plot", () => showPlot(plot, x.name)),
          readButton("Export", () => download(`/profiler/sessions/${encodeURIComponent(x.name)}/export`, `${x.name}.json`))) },
      ],
      list,
      { rowAttrs: (x) => ({ "data-session": x.name, "data-status": x.status }), empty: "no session yet" },
    ));
  }, { types: ["profiler_session"], ms: 3000 }, signal);

  let spans = [];
  poll(async () => { spans = await stepSpans(Number(minutes.value) * 60, signal); }, 3000, signal);
  poll(async () => {
    await latest(signal);
    const t1 = Date.now() / 1000;
    const t0 = t1 - Number(minutes.value) * 60;
    const f = nodeFilter.value.trim();
    const rows = [...history.entries()]
      .filter(([key]) => !f || key.startsWith(f))
      .sort(([a], [b]) => a.localeCompare(b, undefined, { numeric: true }))
      .slice(0, 32)
      .map(([key, hist]) => ({ key, ...hist, spans: spans.filter((sp) => sp.device === key) }));
    fill(timeline, rows.length ? gpuTimeline(rows, t0, t1) : h("p", { class: "muted" }, "no GPU frames yet"));
  }, 1000, signal);
}

function startForm() {
  const name = h("input", { id: "session-name", placeholder: "session name" });
  const freq = h("input", { id: "session-freq", type: "number", value: 1000, min: 100, step: 100 });
  freq.style.width = "6em";
  const nodes = h("input", { id: "session-nodes", placeholder: "nodes (comma; empty: all)" });
  const out = h("span");
  return h("div", { class: "panel row" }, h("b", null, "Start a session"), name, h("label", null, "every (ms)", freq), nodes,
    writeButton("Start", async () => {
      fill(out);
      try {
        const list = nodes.value.split(",").map((x) => x.trim()).filter(Boolean);
        await post("/profiler/sessions", { name: name.value, freq_ms: Number(freq.value), nodes: list });
      } catch (err) { fill(out, errorBox(err)); }
    }, { id: "session-start", class: "primary" }), out);
}

async function showPlot(box, name) {
  const r = await get(`/profiler/sessions/${encodeURIComponent(name)}/plot?format=png`, { raw: true, headers: { Accept: "image/png" } });
  const url = URL.createObjectURL(await r.blob());
  const img = h("img", { src: url, alt: `plots of ${name}` });
  img.style.maxWidth = "100%";
  fill(box, h("div", { class: "panel" }, h("div", { class: "row" }, h("b", { class: "grow" }, `Plots of ${name}`),
    readButton("Close", () => { URL.revokeObjectURL(url); fill(box); })), img));
}

/** Steps of the workflows that ran in the window, as spans on `node:gpuN` devices (finished ones fetched once). */
async function stepSpans(windowS, signal) {
  const since = Date.now() - windowS * 1000;
  const body = await get("/workflows?per_page=50", { signal });
  const out = [];
  for (const wf of body.workflows) {
    if (wf.finished_at && new Date(wf.finished_at).getTime() < since) continue;
    let detail = finished.get(wf.id);
    if (!detail) {
      detail = await get(`/workflows/${wf.id}`, { signal });
      if (detail.finished_at) finished.set(wf.id, detail);
    }
    for (const st of detail.steps) {
      if (!st.started_at || !st.device) continue;
      out.push({
        device: st.device, step: st.action_id, status: st.status, workflow: wf.id, workflow_name: wf.name,
        start: new Date(st.started_at).getTime() / 1000,
        end: (st.finished_at ? new Date(st.finished_at).getTime() : Date.now()) / 1000,
      });
    }
  }
  return out;
}
