// SVG charts drawn by hand (no library): a time axis, a GPU timeline with step spans, and a Gantt chart.

import { colorOf, h, s } from "./ui.js";

const LEFT = 110;

function axis(width, top, height, t0, t1, fmt, every) {
  const out = [];
  const span = t1 - t0 || 1;
  const step = every || niceStep(span / 8);
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    const x = LEFT + ((t - t0) / span) * (width - LEFT - 10);
    out.push(s("line", { class: "grid", x1: x, x2: x, y1: top, y2: top + height }));
    out.push(s("text", { x, y: top + height + 12, "text-anchor": "middle" }, fmt(t)));
  }
  return out;
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= raw) || p * 10;
}

/** Rows of GPUs over [t0, t1] (epoch s): utilisation as a line, and the workflow steps that ran there as spans. */
export function gpuTimeline(rows, t0, t1, width = 1200) {
  const rowH = 54;
  const height = rows.length * rowH + 24;
  const x = (t) => LEFT + ((t - t0) / (t1 - t0 || 1)) * (width - LEFT - 10);
  const body = rows.map((r, i) => {
    const top = i * rowH + 4;
    const pts = [];
    r.t.forEach((t, k) => { if (t >= t0 && r.util[k] !== null) pts.push(`${x(t).toFixed(1)},${(top + 34 - (r.util[k] * 32) / 100).toFixed(1)}`); });
    const spans = r.spans.filter((sp) => sp.end >= t0 && sp.start <= t1).map((sp) => {
      const a = Math.max(x(sp.start), LEFT);
      const w = Math.max(2, x(Math.min(sp.end, t1)) - a);
      return s("g", { class: "span", "data-step": sp.step, "data-workflow": sp.workflow },
        s("title", null, `${sp.workflow_name} / ${sp.step} (${sp.status})`),
        s("rect", { x: a, y: top + 37, width: w, height: 12, fill: colorOf(sp.workflow), rx: 2 }),
        w > 40 ? s("text", { x: a + 3, y: top + 47, fill: "#fff" }, sp.step) : null);
    });
    return s("g", { "data-gpu": r.key },
      s("text", { x: 4, y: top + 20 }, r.key),
      s("line", { class: "grid", x1: LEFT, x2: width - 10, y1: top + 34, y2: top + 34 }),
      s("polyline", { points: pts.join(" "), stroke: "var(--accent)" }),
      spans);
  });
  const fmt = (t) => new Date(t * 1000).toLocaleTimeString(undefined, { hour12: false });
  return s("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, id: "gpu-timeline" },
    axis(width, 0, rows.length * rowH, t0, t1, fmt), body);
}

/** A simulated schedule: one row per GPU, each execution a bar (its model load before it, lighter). */
export function gantt(executions, width = 1200) {
  const gpus = [...new Set(executions.flatMap((e) => e.gpus && e.gpus.length ? e.gpus : [e.gpu_id]))].sort((a, b) => a - b);
  const rowH = 26;
  const t1 = Math.max(1, ...executions.map((e) => e.end_time));
  const t0 = Math.min(0, ...executions.map((e) => e.start_time - (e.switch_time || 0)));
  const x = (t) => LEFT + ((t - t0) / (t1 - t0)) * (width - LEFT - 10);
  const height = gpus.length * rowH + 24;
  const bars = executions.flatMap((e) => (e.gpus && e.gpus.length ? e.gpus : [e.gpu_id]).map((g) => {
    const top = gpus.indexOf(g) * rowH + 4;
    const c = colorOf(e.model_name);
    const load = e.switch_time ? s("rect", { x: x(e.start_time - e.switch_time), y: top, width: Math.max(1, x(e.start_time) - x(e.start_time - e.switch_time)), height: rowH - 6, fill: c, opacity: 0.3 }) : null;
    const w = Math.max(1, x(e.end_time) - x(e.start_time));
    return s("g", { class: "exec", "data-request": e.request_id },
      s("title", null, `${e.request_id} / ${e.node_id}: ${e.model_name} on GPU ${g}, ${e.start_time.toFixed(1)}–${e.end_time.toFixed(1)} s (load ${e.switch_time || 0} s from ${e.loaded_from})`),
      load,
      s("rect", { x: x(e.start_time), y: top, width: w, height: rowH - 6, fill: c, rx: 2 }),
      w > 50 ? s("text", { x: x(e.start_time) + 3, y: top + 14, fill: "#fff" }, `${e.request_id}/${e.node_id}`) : null);
  }));
  return s("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, id: "gantt" },
    axis(width, 0, gpus.length * rowH, t0, t1, (t) => `${t.toFixed(0)} s`),
    gpus.map((g, i) => s("text", { x: 4, y: i * rowH + 18 }, `GPU ${g}`)),
    bars);
}

export function legend(names) {
  return h("div", { class: "row small" }, names.map((n) => {
    const dot = h("span", { class: "dot" });
    dot.style.background = colorOf(n);
    return h("span", null, dot, " ", n);
  }));
}
