// The newest frame of every node (GET /metrics/latest, one call for the whole fleet) and a short history per GPU,
// shared by the fleet page (sparklines) and the profiler's live timeline.

import { get } from "./api.js";

export const KEEP = 600; // points per GPU: ten minutes at one frame a second
export const history = new Map(); // "node:gpuN" -> {t: [], util: [], mem: []} (t in epoch seconds)
const seen = new Map(); // node -> seq of the last frame taken in

export const gpuKey = (node, index) => `${node}:gpu${index}`;

/** Fetch the newest frames, append what is new to the histories, and answer `{nodes: {name: frame}}`. */
export async function latest(signal) {
  const body = await get("/metrics/latest", { signal });
  for (const [node, f] of Object.entries(body.nodes)) {
    if (seen.get(node) === f.seq) continue;
    seen.set(node, f.seq);
    for (const g of f.gpus || []) {
      const key = gpuKey(node, g.index);
      let hist = history.get(key);
      if (!hist) history.set(key, (hist = { t: [], util: [], mem: [] }));
      hist.t.push(f.time);
      hist.util.push(g.utilization_percent ?? null);
      hist.mem.push(g.memory_total_bytes ? (g.memory_used_bytes ?? 0) / g.memory_total_bytes : null);
      if (hist.t.length > KEEP) {
        hist.t.shift();
        hist.util.shift();
        hist.mem.shift();
      }
    }
  }
  return body;
}
