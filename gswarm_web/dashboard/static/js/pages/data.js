// Data: chunks with their locations and references.

import { get } from "../api.js";
import { live } from "../events.js";
import { add, badge, fill, fmtBytes, h, json, table } from "../ui.js";

export async function render(root, _args, signal) {
  const list = h("div", { id: "chunks" });
  const note = h("p", { class: "muted small" });
  add(root, h("h1", null, "Data"), note, list);
  live(async () => {
    const body = await get("/data?per_page=200", { signal });
    note.textContent = `${body.total} chunk(s)${body.total > body.chunks.length ? `, the first ${body.chunks.length} shown` : ""}`;
    fill(list, table(
      [
        { label: "chunk", get: (c) => h("span", { class: "mono small" }, c.chunk_id) },
        { label: "type", get: (c) => c.chunk_type },
        { label: "size", get: (c) => fmtBytes(c.size), cls: "num" },
        { label: "format", get: (c) => c.format || "" },
        { label: "status", get: (c) => badge(c.status) },
        { label: "locations", get: (c) => (c.locations || []).map((l) => h("div", { class: "small" }, badge(l.status), ` ${l.device}`)) },
        { label: "references", get: (c) => json(c.references) },
        { label: "metadata", get: (c) => json(c.metadata) },
      ],
      body.chunks,
      { rowAttrs: (c) => ({ "data-chunk": c.chunk_id }), empty: "no chunk" },
    ));
  }, { types: ["task", "step"], ms: 3000 }, signal); // chunks change through operations and steps
}
