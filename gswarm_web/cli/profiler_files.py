"""Profiler files on the CLI's side: a session's export fetched whole (page after page, written as it comes, so a
session of any length fits) in gswarm's or the original's layout, and an export file of either layout read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..profiling.export import DocumentWriter, export_document, frames_from_rows
from ..profiling.original import ToOriginal, from_original, is_original, original_head, period_of
from .client import ApiClient

EXPORT_TIMEOUT_S = 600.0  # the last page sums up the whole window


def fetch_export(
    c: ApiClient, name: str, path: Path, layout: str, overwrite: bool = True, **window: str | None
) -> dict[str, Any]:
    """Write session `name`'s export to `path` (every page; an existing file only with `overwrite`); returns counts:
    frames, host_frames (gswarm) or frames (original), and pages."""
    info = c.get(f"profiler/sessions/{name}")
    c.timeout = max(c.timeout, EXPORT_TIMEOUT_S)
    cursor: str | None = None
    writer: DocumentWriter | None = None
    conv = ToOriginal(info["freq_ms"] / 1000, info["enable_bandwidth"], info["enable_nvlink"])
    pages = 0
    try:
        while True:
            page = c.get(f"profiler/sessions/{name}/export", cursor=cursor, **window)
            pages += 1
            if writer is None:
                head = {k: page.get(k) for k in ("session_name", "start_time", "end_time", "window")}
                if layout == "original":
                    writer = DocumentWriter(path, original_head(head), ["frames"])
                else:
                    writer = DocumentWriter(path, head, ["frames", "host_frames"])
            if layout == "original":
                for f in frames_from_rows(page["frames"], page["host_frames"]):
                    writer.add("frames", conv.add(f))
            else:
                writer.add("frames", page["frames"])
                writer.add("host_frames", page["host_frames"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    counts = dict(writer.counts)
    if layout == "original":
        writer.add("frames", conv.finish())
        counts["frames"] = writer.counts["frames"]
        writer.close({"summary_by_device": conv.summary()}, overwrite)
    else:
        tail = ("summary_by_device", "summary_by_node", "request_time_info", "steps")
        writer.close({k: page.get(k) for k in tail}, overwrite)
    return {**counts, "pages": pages}


def read_export(path: Path) -> tuple[dict[str, Any], str]:
    """An export file of either layout as gswarm's document (rows and summaries), and which layout it was."""
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("frames"), list):
        raise ValueError(f"{path}: not a profiler export (no `frames` list)")
    if not is_original(doc):
        return doc, "gswarm"
    frames = doc["frames"]
    first = frames[0]
    head = {"session_name": doc.get("session_name") or path.stem, "start_time": doc.get("start_time"),
            "end_time": doc.get("end_time")}  # fmt: skip
    bandwidth = any(k in first for k in ("dram_bandwidth", "dram_bandwidth_rx"))
    nvlink = isinstance(first.get("gpu_bandwidth"), list) and all(
        not isinstance(v, dict) for v in first["gpu_bandwidth"]
    )
    out = export_document(head, from_original(frames), bandwidth, nvlink)
    out["host_frames"], out["summary_by_node"] = [], {}  # the original recorded GPUs only
    out["period_s"] = period_of(frames)
    return out, "original"
