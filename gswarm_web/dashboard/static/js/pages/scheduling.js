// Scheduling: the fleet as the scheduler sees it, and a simulation's schedule as a Gantt chart.

import { get, post } from "../api.js";
import { gantt, legend } from "../charts.js";
import { live } from "../events.js";
import { add, canWrite, errorBox, fill, fmtBytes, h, json, table, writeButton } from "../ui.js";

// A small example (the scheduler's own test config): two workflows, three models, two requests.
const EXAMPLE_CONFIG = {
  models: {
    llm: { name: "LLM-7B", type: "llm", memory_gb: 14, gpus_required: 1, load_time_seconds: 10, tokens_per_second: 50, token_mean: 200, token_std: 50 },
    img: { name: "Image-Gen", type: "image_generation", memory_gb: 8, gpus_required: 1, load_time_seconds: 5, inference_time_mean: 2.0, inference_time_std: 0.5 },
    big: { name: "LLM-30B", type: "llm", memory_gb: 60, gpus_required: 2, load_time_seconds: 20, tokens_per_second: 25, token_mean: 300, token_std: 60 },
  },
  workflows: {
    chain: { name: "LLM then image", nodes: [{ id: "a", model: "llm" }, { id: "b", model: "img" }], edges: [{ from: "a", to: "b" }] },
    pair: { name: "Big model, then a summary", nodes: [{ id: "x", model: "big" }, { id: "y", model: "llm" }], edges: [{ from: "x", to: "y" }] },
  },
};
const EXAMPLE_REQUESTS = {
  requests: [
    { request_id: "r1", timestamp: "2025-06-25T04:25:59", workflow_id: "chain", input_data: {}, node_configs: {}, node_execution_times: { a: 4.0, b: 2.0 } },
    { request_id: "r2", timestamp: "2025-06-25T04:26:00", workflow_id: "pair", input_data: {}, node_configs: {}, node_execution_times: { x: 6.0, y: 3.0 } },
    { request_id: "r3", timestamp: "2025-06-25T04:26:02", workflow_id: "chain", input_data: {}, node_configs: {}, node_execution_times: { a: 3.0, b: 2.0 } },
  ],
};
const POLICIES = ["gswarm", "fifo", "round_robin", "offline", "online"];

export async function render(root, _args, signal) {
  const fleetBox = h("div", { id: "scheduling-fleet" });
  add(root, h("h1", null, "Scheduling"), canWrite() ? simulator() : null, h("h2", null, "The fleet as the scheduler sees it"), fleetBox);
  live(async () => {
    const f = await get("/scheduling/fleet", { signal });
    fill(fleetBox,
      h("p", { class: "muted small" }, `${f.gpus} GPU(s), ${fmtBytes(f.gpu_memory_free_bytes)} GPU memory free`),
      table(
        [
          { label: "node", get: (n) => h("b", null, n.name) },
          { label: "status", get: (n) => `${n.status}${n.schedulable ? "" : " (not schedulable)"}` },
          { label: "GPUs (free / total)", get: (n) => n.gpus.map((g) => h("div", { class: "small" }, `${g.device} #${g.index}: ${fmtBytes(g.memory_free_bytes)} / ${fmtBytes(g.memory_total_bytes)}`)) },
          { label: "DRAM available", get: (n) => `${fmtBytes(n.dram_available_bytes)} / ${fmtBytes(n.dram_total_bytes)}` },
          { label: "bandwidths", get: (n) => json(n.bandwidths) },
        ],
        f.nodes,
        { rowAttrs: (n) => ({ "data-node": n.name }), empty: "no node" },
      ),
      h("h2", null, "Models where the scheduler knows them"), json(f.models));
  }, { types: ["node", "service", "replica", "task", "step"], ms: 5000 }, signal);
}

function simulator() {
  const config = h("textarea", { id: "sim-config", rows: 12 }, JSON.stringify(EXAMPLE_CONFIG, null, 1));
  const requests = h("textarea", { id: "sim-requests", rows: 12 }, JSON.stringify(EXAMPLE_REQUESTS, null, 1));
  const gpus = h("input", { id: "sim-gpus", type: "number", value: 2, min: 1 });
  gpus.style.width = "5em";
  const policy = h("select", { id: "sim-policy" }, POLICIES.map((p) => h("option", { value: p }, p)));
  const out = h("div", { id: "sim-result" });
  return h("div", { class: "panel", id: "simulate" },
    h("div", { class: "row" }, h("b", { class: "grow" }, "Simulate a request trace"), h("label", null, "GPUs", gpus), h("label", null, "policy", policy),
      writeButton("Simulate", async () => {
        fill(out);
        let body;
        try {
          body = { config: JSON.parse(config.value), requests: JSON.parse(requests.value), gpus: Number(gpus.value), policy: policy.value };
        } catch (err) { fill(out, errorBox(`not JSON: ${err.message}`)); return; }
        try {
          const res = await post("/scheduling/simulate", body);
          const models = [...new Set(res.executions.map((e) => e.model_name))];
          fill(out, gantt(res.executions), legend(models), table(
            Object.keys(res.summary).map((k) => ({ label: k, get: (r) => (typeof r[k] === "number" ? Number(r[k].toFixed(3)) : JSON.stringify(r[k])) })),
            [res.summary]));
        } catch (err) { fill(out, errorBox(err)); }
      }, { id: "sim-run", class: "primary" })),
    h("div", { class: "editor" }, h("label", null, "config (JSON)"), h("label", null, "requests (JSON)")),
    h("div", { class: "editor" }, config, requests),
    out);
}
