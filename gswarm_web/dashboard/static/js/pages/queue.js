// Queue: counts per node and priority, running and waiting tasks with progress (cancel), and the recent history.

import { get, post } from "../api.js";
import { live } from "../events.js";
import { add, badge, fill, fmtDuration, fmtTime, h, table, writeButton } from "../ui.js";
import { progress } from "./models.js";

const BUCKETS = ["pending", "running", "completed", "failed"];

export async function render(root, _args, signal) {
  const counts = h("div", { id: "queue-counts" });
  const running = h("div", { id: "queue-running" });
  const waiting = h("div", { id: "queue-waiting" });
  const history = h("div", { id: "queue-history" });
  add(root, h("h1", null, "Queue"), counts, h("h2", null, "Running"), running, h("h2", null, "Waiting"), waiting,
    h("h2", null, "Recently finished"), history);
  live(async () => {
    const [q, run, wait, hist] = await Promise.all([
      get("/queue", { signal }),
      get("/queue/tasks?status=running&per_page=100", { signal }),
      Promise.all(["pending", "queued"].map((st) => get(`/queue/tasks?status=${st}&per_page=100`, { signal })))
        .then((pages) => ({ tasks: pages.flatMap((p) => p.tasks) })),
      get("/queue/history?limit=30", { signal }),
    ]);
    const rows = [];
    for (const [node, byPriority] of Object.entries(q.nodes)) {
      for (const [priority, c] of Object.entries(byPriority)) rows.push({ node, priority, ...c });
    }
    rows.push({ node: "all", priority: "", ...q.totals });
    fill(counts, table(
      [{ label: "node", get: (r) => (r.node === "all" ? h("b", null, "all") : r.node) }, { label: "priority", get: (r) => r.priority },
        ...BUCKETS.map((b) => ({ label: b, get: (r) => String(r[b] ?? 0), cls: "num" }))],
      rows,
      { rowAttrs: (r) => ({ "data-node": r.node, "data-priority": r.priority }) },
    ));
    fill(running, tasks(run.tasks, true));
    fill(waiting, tasks(wait.tasks, true));
    fill(history, tasks(hist.tasks, false));
  }, { types: ["task", "step"], ms: 2000 }, signal);
}

function tasks(rows, live) {
  return table(
    [
      { label: "task", get: (t) => h("span", { class: "mono small" }, t.task_id.slice(0, 8)) },
      { label: "kind", get: (t) => t.kind },
      { label: "node", get: (t) => t.node || "—" },
      { label: "priority", get: (t) => t.priority },
      { label: "status", get: (t) => badge(t.status) },
      { label: "what", get: (t) => t.model_name || t.service_id || "" },
      { label: "progress", get: (t) => progress(t.progress) },
      { label: live ? "started" : "finished", get: (t) => fmtTime(live ? t.started_at || t.created_at : t.finished_at) },
      { label: "took", get: (t) => fmtDuration(t.started_at, t.finished_at) },
      { label: "", get: (t) => (live ? writeButton("Cancel", () => post(`/queue/tasks/${t.task_id}/cancel`), { class: "danger" }) : t.error ? h("span", { class: "error small" }, t.error.message || "") : "") },
    ],
    rows,
    { rowAttrs: (t) => ({ "data-task": t.task_id, "data-status": t.status }), empty: "none" },
  );
}
